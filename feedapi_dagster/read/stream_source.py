"""A feed as a Spark Structured Streaming source: `spark.readStream.format("feedapi")`.

    spark.dataSource.register(FeedDataSource)
    events = spark.readStream.format("feedapi").option("url", url).option("maxEventsPerTrigger", "50000").load()
    stream_to_delta(events, "lakehouse/orders", "lakehouse/_checkpoints/orders").trigger(availableNow=True).start()

**Offsets** are the partitions' cursors (`stream_offsets.StreamOffset`, JSON): per partition the cursor to resume
after, the position its next event gets, whether it is drained, the ancestor a method-2 child took its
cursor from, and (at-least-once feeds) the ids of its newest events. A partition not in an offset
starts from `_first` (or from its method-2 ancestor's cursor), as the batch loads plan it
(`planning.plan_feed` over the offset as a `FeedState`): new partitions from discovery join, drained
ones are read no more, a method-1 child waits until its parent is drained in the micro-batch's start
offset, a method-2 child starts from its ancestor's cursor there.

**Who reads.** A feed's cursors are opaque: the end of a micro-batch (the cursor after its last page)
is known only by reading its pages. So the driver reads in `latestOffset` (as pyspark's
`SimpleDataSourceStreamReader` does, but with read limits and several partitions read concurrently),
keeps the micro-batch's Arrow rows until Spark asks for its partitions, and hands them to the tasks
inside the input partitions: each event is fetched once. The micro-batch is bounded by
`maxEventsPerTrigger` (pyspark's admission control, `ReadMaxRows`), which bounds the driver's memory:
whole pages up to the bound (`_admitted`); the pages cut off are the only events fetched again.
Where a feed offers FeedAPI's `stream` fetch, `_read_due` is the seam: a micro-batch could read a
stream for its duration instead of paging (this source pages).

**Determinism.** A micro-batch Spark runs again after a restart (its offsets are in the query's
offset log, its rows no longer in the driver) is read again by its tasks from the start offset's
cursors: a feed is an ordered log, so the events after a cursor are the same, and the task takes
exactly `end.position - start.position` of them (after the same deduplication), the rows the first
run yielded.

**Deduplication** (at-least-once feeds): an event whose id was already read in the same partition
within the micro-batch (`read_tasks.PartitionRead`), or is among the ids of the partition's newest
`dedupWindow` events (100) of the earlier micro-batches (carried in the offset; a method-2 child starts
with its ancestor's), is dropped. A repeat of an event older than that window is kept: unlike the
batch loads, the stream does not join against the Delta table.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from feedapi_dagster.errors import FeedApiDagsterError, LoadError
from feedapi_dagster.planning import plan_feed, task_groups
from feedapi_dagster.protocol import FeedInfo
from feedapi_dagster.read.read_tasks import END_COLUMN, PartitionRead, PartitionStart, ReadEnd, read_schema
from feedapi_dagster.read.rows import EVENT_SCHEMA
from feedapi_dagster.read.stream_offsets import (
    PartitionOffset,
    StreamOffset,
    drop_recent,
    newest_ids,
    renumbered,
    without_recent,
)

log = logging.getLogger(__name__)

MAX_EVENTS_PER_TRIGGER = "maxEventsPerTrigger"
DEDUP_WINDOW = "dedupWindow"
START_OFFSET = "startOffset"
DEFAULT_DEDUP_WINDOW = 100
STREAM_OPTIONS = frozenset({MAX_EVENTS_PER_TRIGGER.lower(), DEDUP_WINDOW.lower(), START_OFFSET.lower()})


class StreamReplayFailed(LoadError):
    """A micro-batch read again after a restart did not find the events it read the first time."""


class PrefetchedRows(InputPartition):
    """Rows the driver read in `latestOffset`, as Arrow IPC: the task hands them on."""

    def __init__(self, index: int, ipc: bytes):
        super().__init__(index)
        self.ipc = ipc


class MicroBatchOffsets(InputPartition):
    """The micro-batch's start and end offsets, as one row of its own (`checkpointRows`)."""

    def __init__(self, index: int, start: str, end: str):
        super().__init__(index)
        self.start = start
        self.end = end


class Replay(InputPartition):
    """A micro-batch's partitions to read again from their start offsets: (id, start, events)."""

    def __init__(self, index: int, info: FeedInfo, reads: list[tuple[int, PartitionOffset, int]]):
        super().__init__(index)
        self.info = info
        self.reads = reads


# a partition's part of a micro-batch: its rows, where it ends, and whether there may be more now
_PartitionBatch = tuple[list[pa.RecordBatch], PartitionOffset, bool]


@dataclass
class _Batch:
    start: str
    end: str
    partitions: list[PrefetchedRows]


class FeedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module docstring. `options`: the data source's `FeedSourceOptions`; `start`: the offset
    a query without a checkpoint starts from (default: the options' start cursors)."""

    def __init__(
        self, options, max_events_per_trigger: int | None, dedup_window: int, start: StreamOffset | None = None
    ):
        self.options = options
        self.max_events_per_trigger = max_events_per_trigger
        self.dedup_window = dedup_window
        self.start = start
        # read by `latestOffset`, until Spark commits them (Spark calls a source's `latestOffset`,
        # `partitions` and `commit` one after the other, in one Python process of the driver)
        self._batches: list[_Batch] = []
        # availableNow: the discovery at the query's start, and the partitions read to their end since
        self._available_now: FeedInfo | None = None
        self._caught_up: set[int] = set()

    def __getstate__(self) -> dict:
        # Spark pickles the reader for its tasks (`read`): they need the options, not the driver's rows
        return {**self.__dict__, "_batches": [], "_available_now": None, "_caught_up": set()}

    # ---------------------------------------------------------------- offsets
    def initialOffset(self) -> dict:
        if self.start is not None:
            return self.start.to_json()
        cursors, positions = self.options.start_cursors, self.options.start_positions
        return StreamOffset(
            {pid: PartitionOffset(cursor, positions.get(pid, 0)) for pid, cursor in cursors.items()}
        ).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_events_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.max_events_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        # the feed's partitions now; the query ends when each due one was read to its end once
        self._available_now = self._discover()
        self._caught_up = set()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        offset = StreamOffset.from_json(start)
        info = self._available_now or self._discover()
        wanted = self.options.partitions
        due = [
            plan
            for plan in plan_feed(info, offset.feed_state())
            if plan.due and plan.partition_id not in self._caught_up and (wanted is None or plan.partition_id in wanted)
        ]
        if not due:
            return start
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        share = None if budget is None else max(1, budget // len(due))
        starts = {plan.partition_id: offset.start_of(plan.partition_id, plan.inherited_from) for plan in due}
        read = self._read_due(info, starts, share)
        if budget is not None:
            read = self._admitted(read, starts, budget)
        ends = dict(offset.partitions)
        rows: list[pa.RecordBatch] = []
        for pid, (batches, end, bounded) in read.items():
            if self._available_now is not None and not bounded:
                self._caught_up.add(pid)
            if end != starts[pid] or pid in offset.partitions:
                ends[pid] = end
            rows.extend(batches)
        end_json = StreamOffset(ends).to_json()
        if json.dumps(end_json) != json.dumps(start):
            self._keep(start, end_json, rows)
        return end_json

    def reportLatestOffset(self) -> dict | None:
        return None  # knowing it would take reading the feed to its end

    # ---------------------------------------------------------------- reading
    def _discover(self) -> FeedInfo:
        with self.options.client() as client:
            return client.discover()

    def _read_due(
        self, info: FeedInfo, starts: dict[int, PartitionOffset], share: int | None
    ) -> dict[int, _PartitionBatch]:
        """The due partitions read by the driver, each from its start up to `share` events (at the first
        checkpoint at or past it) or its current end. The seam for FeedAPI's `stream` fetch: a
        micro-batch could read a stream for a while here instead of paging."""
        settings = replace(self.options.read_settings(), checkpoint_rows=True, max_events=share)
        exactly_once = info.exactly_once

        def one(pid: int) -> tuple[int, _PartitionBatch]:
            start = starts[pid]
            with self.options.client(info.only([pid])) as client:
                read = PartitionRead(settings, client, PartitionStart(pid, start.cursor, start.position))
                rows = [b for b in read.batches() if b.num_rows]
            end_row = rows.pop()  # the checkpoint row, a batch of its own: where the read stopped
            read_end = ReadEnd.from_json(end_row.column(END_COLUMN)[0].as_py())
            if read_end.error:
                where = f"feed {self.options.feed.safe_url} partition {pid}"
                # the client's errors name the feed and the partition already
                raise FeedApiDagsterError(read_end.error if where in read_end.error else f"{where}: {read_end.error}")
            events = [b.drop_columns([END_COLUMN]) for b in rows]
            if not exactly_once:
                events = without_recent(events, start)
            kept = sum(b.num_rows for b in events)
            end = PartitionOffset(
                end_row.column("cursor")[0].as_py(),
                start.position + kept,
                read_end.drained,
                start.inherited_from,
                newest_ids(start.recent_ids, events, self.dedup_window) if not exactly_once else (),
            )
            return pid, (events, end, read_end.bounded)

        threads = max(1, min(self.options.threads_per_task, len(starts)))
        with ThreadPoolExecutor(threads, thread_name_prefix="feedapi-stream") as pool:
            return dict(pool.map(one, sorted(starts)))

    def _admitted(self, read: dict[int, _PartitionBatch], starts: dict[int, PartitionOffset], budget: int):
        """The reads cut to `budget` events in all: whole pages only (a page's rows share its cursor, the
        resume point after it), in partition order; a single page larger than the budget is admitted
        alone, or the stream would never move. The pages cut off are read again by the next trigger."""
        admitted: dict[int, _PartitionBatch] = {}
        total = 0
        for pid, (batches, end, bounded) in read.items():
            rows = pa.Table.from_batches(batches, EVENT_SCHEMA)
            if total + rows.num_rows <= budget:
                admitted[pid] = (batches, end, bounded)
                total += rows.num_rows
                continue
            cursors = rows.column("cursor").to_pylist()
            keep = 0  # rows of the whole pages that fit
            for index in range(len(cursors)):
                last_of_page = index + 1 == len(cursors) or cursors[index + 1] != cursors[index]
                if last_of_page and (total + index + 1 <= budget or total + keep == 0):
                    keep = index + 1
                elif total + index + 1 > budget and total + keep > 0:
                    break
            start = starts[pid]
            kept = rows.slice(0, keep).to_batches()
            if keep == 0:
                end = start
            else:
                end = replace(
                    end,
                    cursor=cursors[keep - 1],
                    position=start.position + keep,
                    drained=False,
                    recent_ids=newest_ids(start.recent_ids, kept, self.dedup_window) if end.recent_ids else (),
                )
            admitted[pid] = (kept, end, True)
            total += keep
        return admitted

    def _keep(self, start: dict, end: dict, rows: list[pa.RecordBatch]) -> None:
        by_partition: dict[int, list[pa.RecordBatch]] = {}
        for batch in rows:
            by_partition.setdefault(batch.column("partition_id")[0].as_py(), []).append(batch)
        groups = task_groups({pid: sum(b.num_rows for b in bs) for pid, bs in by_partition.items()}, None)
        partitions = [
            PrefetchedRows(index, _ipc([b for pid in group for b in by_partition[pid]]))
            for index, group in enumerate(groups)
        ]
        self._batches.append(_Batch(json.dumps(start), json.dumps(end), partitions))

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        start_key, end_key = json.dumps(start), json.dumps(end)
        kept = next((b for b in self._batches if b.start == start_key and b.end == end_key), None)
        partitions: list[InputPartition] = [
            *(
                kept.partitions
                if kept is not None
                else self._replay(StreamOffset.from_json(start), StreamOffset.from_json(end))
            )
        ]
        if self.options.checkpoint_rows:
            partitions.append(MicroBatchOffsets(len(partitions), start_key, end_key))
        return partitions

    def _replay(self, start: StreamOffset, end: StreamOffset) -> list[InputPartition]:
        """A micro-batch whose rows the driver no longer holds (Spark runs it again after a restart)."""
        reads = {}
        for pid, ends in end.partitions.items():
            begin = start.start_of(pid, ends.inherited_from)
            if ends.position > begin.position:
                reads[pid] = (begin, ends.position - begin.position)
        if not reads:
            return []
        log.info("micro-batch %s read again from its start cursors (a restart)", sorted(reads))
        info = self._discover()
        groups = task_groups({pid: events for pid, (_, events) in reads.items()}, None)
        return [
            Replay(index, info.only(group), [(pid, *reads[pid]) for pid in group]) for index, group in enumerate(groups)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, MicroBatchOffsets):
            yield micro_batch_offsets_row(partition.start, partition.end)
            return
        if isinstance(partition, PrefetchedRows):
            batches: Iterator[pa.RecordBatch] = iter(pa.ipc.open_stream(partition.ipc))
        else:
            assert isinstance(partition, Replay)  # what `partitions` made
            batches = (
                b
                for pid, start, events in partition.reads
                for b in self._read_again(partition.info, pid, start, events)
            )
        if not self.options.checkpoint_rows:
            yield from batches
            return
        for batch in batches:  # event rows have no offsets
            yield batch.append_column(END_COLUMN, pa.nulls(batch.num_rows, pa.string()))

    def _read_again(self, info: FeedInfo, pid: int, start: PartitionOffset, events: int) -> Iterator[pa.RecordBatch]:
        settings = replace(self.options.read_settings(), checkpoint_rows=False, max_events=None)
        left = events
        with self.options.client(info) as client:
            read = PartitionRead(settings, client, PartitionStart(pid, start.cursor, start.position))
            for batch in read.batches():  # left unfinished at the end: the client's session closes
                if not info.exactly_once:
                    batch = drop_recent(batch, start.recent_ids)
                taken = batch.slice(0, min(left, batch.num_rows))
                if taken.num_rows:
                    yield renumbered(taken, start.position + events - left)
                left -= taken.num_rows
                if not left:
                    return
        if left:
            raise StreamReplayFailed(
                f"feed {self.options.feed.safe_url} partition {pid}: a micro-batch read again after a restart "
                f"found {events - left} of its {events} events after cursor {start.cursor}: the feed no longer "
                "holds what it served"
            )

    def commit(self, end: dict) -> None:
        end_key = json.dumps(end)
        done = next((i for i, b in enumerate(self._batches) if b.end == end_key), None)
        if done is not None:
            del self._batches[: done + 1]


def micro_batch_offsets_row(start: str, end: str) -> pa.RecordBatch:
    """A micro-batch's row of offsets (`checkpointRows`): NULL event columns, and in `END_COLUMN` the
    JSON of {"start": offset, "end": offset}: what the Dagster stream commits as the cursor of record."""
    columns: dict[str, list] = {name: [None] for name in EVENT_SCHEMA.names}
    columns[END_COLUMN] = [f'{{"start":{start},"end":{end}}}']
    return pa.RecordBatch.from_pydict(columns, schema=read_schema(True))


def micro_batch_offsets(row_json: str) -> tuple[StreamOffset, StreamOffset]:
    """The start and end offsets of a micro-batch's row of offsets."""
    fields = json.loads(row_json)
    return StreamOffset.from_json(fields["start"]), StreamOffset.from_json(fields["end"])


def _ipc(batches: list[pa.RecordBatch]) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, EVENT_SCHEMA) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue()
