"""`FeedStream`: a feed read as a Structured Streaming query (`stream_source.py`) and committed as the
batch loads commit, so that both keep ONE cursor of record and a feed can switch from one to the other.

    query = FeedStream(feed, table, run_id=run_id, checkpoint=folder).start({"availableNow": True})

**One record.** Each micro-batch lands in one Delta commit, made by the batch loads' `commit.ReadCommit`
(`foreachBatch`): its rows and the whole `FeedState` they end at (`cursor_record.py`).
A query starts from that record (the `startOffset` option: the state the table's commits hold) with a
checkpoint of its own, which is the query's scratch, not a record: a batch load run after a stream, or
a stream after a batch load, continues from the last commit of either. (A query of
`stream_to_delta` (below) is the other way round: its cursors are in its checkpoint, and Delta's
streaming sink writes no state into the table.)

**The dangerous moments.** A query killed before a micro-batch's commit lands left nothing of it in the
table: the next query (the next run) starts from the commit before and reads it again. Killed after it:
the next query starts after it. A micro-batch Spark runs again from the checkpoint (a query restarted
with the same checkpoint) finds the table's cursors already at its end and commits nothing. A batch
load that committed the partitions meanwhile (a stream and a load at once: the Dagster pool prevents
it) makes the micro-batch's commit fail with `PartitionConflict`, nothing of it written.

**Its run's lease.** A query on a Spark Connect server outlives the client that started it: the stream
renews a lease while its query runs, and each micro-batch checks it before it reads and before it
commits (`stream_lease.py`): a query whose run is gone commits nothing once the lease has expired, and
the next query of the table stops it.

**The commit** is the batch loads' (`commit.ReadCommit`): deduplication of at-least-once feeds against
the rows the table holds (on top of the source's window of recent ids within the query), the new
partition states, the sink's commit and its dangerous moments.
"""

from __future__ import annotations

import json
import logging
import shutil
from typing import TYPE_CHECKING, Any, Literal

from feedapi_dagster.errors import PayloadFormMismatch
from feedapi_dagster.lakehouse.commit import Moment, PartitionAdvance, ReadCommit
from feedapi_dagster.lakehouse.cursor_record import CommittedState
from feedapi_dagster.lakehouse.feed_table import FeedTable, local_path
from feedapi_dagster.lakehouse.payload_form import DATA_COLUMN, data_column
from feedapi_dagster.lakehouse.sink import DeltaSink, partition_conflict
from feedapi_dagster.lakehouse.stream_lease import LeaseCheck, LeaseRenewal, query_name, stop_queries_of_gone_runs
from feedapi_dagster.planning import PartitionState
from feedapi_dagster.planning.payload_columns import ColumnsSettings
from feedapi_dagster.protocol import FeedClient, FeedInfo, FeedSettings
from feedapi_dagster.read.datasource import SOURCE_NAME, FeedSourceOptions
from feedapi_dagster.read.read_tasks import END_COLUMN
from feedapi_dagster.read.registration import register_feed_source
from feedapi_dagster.read.stream_offsets import PartitionOffset, StreamOffset
from feedapi_dagster.read.stream_source import MAX_EVENTS_PER_TRIGGER, START_OFFSET, micro_batch_offsets

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

log = logging.getLogger(__name__)

WRITE_TASK_EVENTS = 100_000


class FeedStream:
    """A feed's stream into its `FeedTable`; `run_id` names its commits, `checkpoint` is its query's
    (a folder no other query uses)."""

    def __init__(
        self,
        feed: FeedSettings,
        table: FeedTable,
        *,
        run_id: str,
        checkpoint: str,
        max_events_per_trigger: int | None = None,
        ship_package: bool = False,
        on_moment: Moment | None = None,
    ):
        """`on_moment`: called before and after each micro-batch's commit (tests fail it there); it runs
        where `foreachBatch` runs."""
        # the token is read here and reaches the source as Spark's redacted option, as a batch load's
        self.feed = feed.with_token()
        self.table = table
        self.run_id = run_id
        self.checkpoint = checkpoint
        self.max_events_per_trigger = max_events_per_trigger
        self.sink = DeltaSink(table, run_id=run_id)
        self.on_moment = on_moment
        self.info: FeedInfo | None = None  # the discovery of the last `start`
        self.started_from: CommittedState | None = None  # the cursor of record it started from
        self._lease = LeaseRenewal(table.spark, run_id)
        register_feed_source(table.spark, ship=ship_package, protocol=self.feed.protocol)

    def start(self, trigger: dict[str, Any]) -> StreamingQuery:
        """Start the query with `trigger` (`{"availableNow": True}` or `{"processingTime": "10 seconds"}`,
        `DataStreamWriter.trigger`'s arguments) from the table's cursor of record. The feed is discovered
        once here (`info`): whether it is exactly-once, and its method-2 ancestry, for deduplication."""
        with FeedClient(self.feed) as client:
            self.info = client.discover()
            if self.table.form == "columns":
                self.table.declare(client.declared_columns())
        spark = self.table.spark
        # a query on a Spark Connect server outlives the client that started it (a killed run): one
        # whose run is gone has no purpose left
        stop_queries_of_gone_runs(spark, self.table.path, self.run_id)
        self.started_from = self.sink.committed_state(refresh=True)
        start = StreamOffset.of_state(self.started_from.state)  # the partitions' cursors of record
        options = FeedSourceOptions(self.feed, checkpoint_rows=True).spark_options()
        options[START_OFFSET] = json.dumps(start.to_json())
        if self.max_events_per_trigger is not None:
            options[MAX_EVENTS_PER_TRIGGER] = str(self.max_events_per_trigger)
        events = spark.readStream.format(SOURCE_NAME).options(**options).load()
        commit = MicroBatchCommit(self.table.path, self.run_id, self.info, self.on_moment, self.table.columns)
        self._lease.start()
        try:
            query = (
                events.writeStream.foreachBatch(commit)
                .option("checkpointLocation", self.checkpoint)
                .queryName(query_name(self.table.path, self.run_id))
                .trigger(**trigger)
                .start()
            )
        except BaseException:
            self._lease.end()
            raise
        self._lease.query = query
        return query

    def stop(self, query: StreamingQuery) -> None:
        """Stop the query (after its micro-batch's commit or before it), give its lease up and remove its
        checkpoint (it is not a record: the table's commits are) where it is on a local file system; on
        object storage it stays (no public Spark API deletes a path)."""
        if query.isActive:
            query.stop()
        self._lease.end()
        if folder := local_path(self.checkpoint):
            shutil.rmtree(folder, ignore_errors=True)
        else:
            log.info("the stream's checkpoint %s stays: remove it when you like", self.checkpoint)


class MicroBatchCommit:
    """`foreachBatch`'s function: a micro-batch's rows and the cursors they end at, in one Delta commit.
    It runs where Spark runs a query's `foreachBatch` (the driver of a classic session; a Python process
    of the Spark Connect server), so it holds the table's path, not the client's objects."""

    def __init__(
        self,
        path: str,
        run_id: str,
        info: FeedInfo,
        on_moment: Moment | None = None,
        columns: ColumnsSettings | None = None,
    ):
        """`columns`: how a columns table's typed columns evolve (the feed's `payload_columns`)."""
        self.path = path
        self.columns = columns
        self.run_id = run_id
        self.info = info
        self.on_moment = on_moment
        self.lease = LeaseCheck(run_id)
        self._committer: ReadCommit | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_committer": None}  # a sink is its process's: made on first use

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        # kept for its two uses (the offsets row, then the rows): a micro-batch read again after a restart
        # is fetched from the feed once
        frame = frame.persist()
        try:
            self._commit(frame, batch_id)
        finally:
            frame.unpersist()

    def _commit(self, frame: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        self.lease.ensure_alive(frame.sparkSession)  # before the feed is read for it
        offsets = frame.where(F.col(END_COLUMN).isNotNull()).select(END_COLUMN).collect()
        if not offsets:
            return
        start, end = micro_batch_offsets(offsets[0][0])
        rows = frame.where(F.col(END_COLUMN).isNull()).drop(END_COLUMN)
        committer = self._committer_of(frame.sparkSession)
        base = committer.sink.committed_state(refresh=True)
        moved = {pid: e for pid, e in end.partitions.items() if start.start_of(pid, e.inherited_from) != e}
        if not moved:
            return
        if all(_holds(base.state.get(pid), e) for pid, e in moved.items()):
            log.info("micro-batch %s of %s is in the table already (committed before a restart)", batch_id, self.path)
            return
        for pid in moved:
            found = base.state.get(pid)
            began = start.partitions.get(pid)
            if (found.cursor if found else None) != (began.cursor if began else None):
                raise partition_conflict(pid, began.state() if began else None, found)
        starts = {
            pid: base.state.get(pid) or PartitionState(inherited_from=e.inherited_from) for pid, e in moved.items()
        }
        advances = {
            pid: PartitionAdvance(
                cursor=e.cursor, events=e.position - start.start_of(pid, e.inherited_from).position, drained=e.drained
            )
            for pid, e in moved.items()
        }
        # a write task per WRITE_TASK_EVENTS events: the source's input partitions (one per partition read,
        # and the offsets row's) would be as many tasks, each a few Parquet files, for a micro-batch of a
        # thousand events (one task: the write's job 100-150 ms shorter, benchmarks/README.md)
        rows = rows.coalesce(-(-sum(a.events for a in advances.values()) // WRITE_TASK_EVENTS) or 1)
        staged = committer.stage(rows, starts, advances, base)
        self.lease.ensure_alive(frame.sparkSession)  # the read and staging took time: once more, last
        committer.commit(staged.rows, staged.states, base)

    def _committer_of(self, spark: SparkSession) -> ReadCommit:
        if self._committer is None or self._committer.sink.table.spark is not spark:
            # on object storage the log is read through Spark: its session has the credentials, this
            # process (a Python worker of a Spark Connect server) may not
            read_log: Literal["auto", "spark"] = "auto" if local_path(self.path) else "spark"
            table = FeedTable(spark, self.path, read_log=read_log, columns=self.columns)
            sink = DeltaSink(table, run_id=self.run_id)
            self._committer = ReadCommit(sink, self.info, on_moment=self.on_moment)
        return self._committer


def _holds(found: PartitionState | None, end: PartitionOffset) -> bool:
    """Whether the table's state of a partition is where a micro-batch ends it (it committed already)."""
    return found is not None and found.cursor == end.cursor and found.drained == end.drained


def stream_to_delta(events: DataFrame, path: str, checkpoint: str, run_id: str = "stream") -> DataStreamWriter:
    """The stream's writer into the feed table at `path` (created as the batch loads create it, with
    their columns: `loaded_at` is when Spark ran the micro-batch, `run_id` names the stream), with the
    query's checkpoint at `checkpoint`; a variant table's `data` too. Delta's streaming sink commits each micro-batch once: it records
    the query's id and batch id in the commit (`txn`) and skips a batch it already committed, so a
    micro-batch Spark runs again after a restart lands once. Add a trigger and `start()` it."""
    from pyspark.sql import functions as F

    table = FeedTable(events.sparkSession, path)
    table.ensure_table()
    if table.form == "columns":  # its rows are looked at before they are written: not a plain Delta sink's
        raise PayloadFormMismatch(
            f"the Delta table {path} has typed payload columns (payload_form: columns): its stream is the "
            "feed's own (`FeedStream`, the `feedapi_<feed>_stream` job), which types each micro-batch"
        )
    if table.form == "variant":  # a variant table's rows have their payload parsed, as `FeedTable.write`'s
        events = events.withColumn(DATA_COLUMN, data_column())
    return (
        events.withColumn("loaded_at", F.current_timestamp())
        .withColumn("run_id", F.lit(run_id))
        .writeStream.format("delta")
        .outputMode("append")
        .option("checkpointLocation", checkpoint)
        .option("path", path)
    )
