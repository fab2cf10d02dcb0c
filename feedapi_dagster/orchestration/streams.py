"""A feed run as a stream from Dagster: the job `feedapi_<feed>_stream`, one op that runs the feed's
Structured Streaming query (`lakehouse.feed_stream.FeedStream`) for the run. With `catch_up` (the
default), `FeedApiResource.stream` first reads the feed's backlog by a batch load and the query starts
from the cursor of record it committed (with `available_now`, that load is the whole run).

* `trigger: available_now` (the default): the query reads what the feed holds now, in micro-batches,
  and the run ends. The feed's schedule runs it once per tick when `schedule.mode` is `stream`.
* `trigger: processing_time`: a micro-batch every `interval_seconds`; the run lasts `run_seconds`, or
  until it is terminated from the UI (the query is stopped then, after its micro-batch's commit or
  before it: either way the next run continues from the table's cursor of record).

Each micro-batch commits its rows and the cursors they end at in one Delta commit, as a batch load's
commit does: streams and batch loads keep ONE cursor of record (the table's commits), so a feed can
switch between them at any time with no loss and no duplicate. The query's checkpoint is the run's
scratch (under `<lakehouse>/_streams/<feed>/<run id>`, removed at the end of the run on a local disk).

While it runs, the op logs each micro-batch (where its seconds went, from Spark's progress), what the
commits brought, and a materialization per partition each commit moved, with the cursor of record in its
metadata as a batch load's. The stream job is in the feed's pool: it never runs beside a load of the
same feed, nor beside its maintenance.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import dagster as dg
from pydantic import Field

from feedapi_dagster.lakehouse.cursor_record import CommittedState, read_committed_state
from feedapi_dagster.lakehouse.feed_stream import FeedStream
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.lakehouse.load_report import LoadOutcome, LoadStatus, PartitionReport
from feedapi_dagster.planning import FeedState
from feedapi_dagster.protocol import FeedInfo
from feedapi_dagster.spark.failures import python_cause
from feedapi_dagster.spark.watchdog import answering

from .dead_streams import mark_query_started, mark_query_stopped
from .loads import FeedBinding, failing_clearly
from .metadata import add_unknown_partitions, materializations, payload_warnings

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

# how often the op looks at the query: its progress in the log, its commits as materializations
POLL_SECONDS = 2


class StreamConfig(dg.Config):
    """Run configuration of a feed's stream job."""

    trigger: Literal["available_now", "processing_time"] = Field(
        default="available_now",
        description="available_now: read what the feed holds now, then end; processing_time: a micro-batch "
        "every interval_seconds until run_seconds have passed or the run is terminated",
    )
    interval_seconds: float = Field(default=10.0, gt=0, description="processing_time: the trigger's interval")
    run_seconds: float | None = Field(
        default=None, gt=0, description="processing_time: stop the stream after this long (default: when terminated)"
    )
    timeout_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="available_now micro-batches (catch_up false): fail the run when they have not ended by then "
        "(a catch-up's batch load is bounded as a load is)",
    )
    max_events_per_trigger: int | None = Field(default=None, ge=1, description="events per micro-batch at most")
    catch_up: bool = Field(
        default=True,
        description="read the feed's backlog by a batch load first (one Spark job and one commit, faster than "
        "micro-batches), then start the query from there; with available_now that load is the whole run",
    )

    def spark_trigger(self) -> dict[str, bool | str]:
        if self.trigger == "available_now":
            return {"availableNow": True}
        return {"processingTime": f"{self.interval_seconds:g} seconds"}


def stream_run(
    context: dg.OpExecutionContext, table: FeedTable, binding: FeedBinding, config: StreamConfig, ship_package: bool
) -> Iterator[dg.AssetMaterialization]:
    """Run the feed's stream for the run (see the module docstring): the materializations of the
    partitions its commits moved, as they land; a `dg.Failure` when the query fails or times out."""
    run_id = context.run.run_id
    spark = table.spark
    with answering(
        spark, f"the stream of feed {binding.name}", unresponsive_seconds=binding.feed.load.spark_unresponsive_seconds
    ):
        # its set-up registers the data source (and ships this package) through Spark Connect
        stream = FeedStream(
            binding.feed.settings,
            table,
            run_id=run_id,
            checkpoint=f"{binding.project.lakehouse.rstrip('/')}/_streams/{binding.name}/{run_id}",
            max_events_per_trigger=config.max_events_per_trigger,
            ship_package=ship_package,
        )
        # said before the query starts: a run killed at any moment after leaves a query the next run finds
        mark_query_started(context.instance, binding, run_id, spark)
        try:
            with failing_clearly(binding.name, "the stream"):  # its discovery
                query = stream.start(config.spark_trigger())
        except BaseException:
            mark_query_stopped(context.instance, run_id)
            raise
        assert stream.started_from is not None and stream.info is not None  # set by `start`
        context.log.info(
            "feed %s: stream started (%s, query %s) from the cursor of record: %s",
            binding.name,
            config.trigger,
            query.id,
            stream.started_from.describe(),
        )
        seen = _Progress(context, binding, table, stream.info, stream.started_from)
        started = time.monotonic()
        failure: str | None = None
        try:
            while True:
                ended = _await(query, POLL_SECONDS)
                yield from seen.new_commits(query)
                if ended:
                    break
                waited = time.monotonic() - started
                if config.trigger == "available_now" and waited > config.timeout_seconds:
                    failure = f"the catch-up did not end within timeout_seconds ({config.timeout_seconds:g} s)"
                    break
                if config.run_seconds is not None and waited > config.run_seconds:
                    context.log.info(
                        "feed %s: run_seconds (%g) passed: stopping the stream", binding.name, config.run_seconds
                    )
                    break
        finally:  # also when the run is terminated: the query must not outlive its run
            stream.stop(query)
            mark_query_stopped(context.instance, run_id)
        yield from seen.new_commits(query)
        if (error := query.exception()) is not None:
            failure = python_cause(error)
    if failure is not None:
        raise dg.Failure(
            f"feed {binding.name}: the stream failed: {failure}. What its micro-batches committed stays; "
            "the next run continues from the table's cursor of record",
            allow_retries=False,
        )


def _await(query: StreamingQuery, seconds: int) -> bool:
    """Whether the query ended within `seconds` (a classic session raises its failure: kept for later)."""
    from pyspark.errors import StreamingQueryException

    try:
        return bool(query.awaitTermination(seconds))
    except StreamingQueryException:
        return True


class _Progress:
    """What the op has reported: the cursor of record it last saw, the micro-batches it logged."""

    def __init__(
        self,
        context: dg.OpExecutionContext,
        binding: FeedBinding,
        table: FeedTable,
        info: FeedInfo,
        started_from: CommittedState,
    ):
        self.context = context
        self.binding = binding
        self.table = table
        self.info = info
        self.committed = started_from
        self.logged_batches: set[int] = set()

    def new_commits(self, query: StreamingQuery) -> Iterator[dg.AssetMaterialization]:
        for progress in query.recentProgress:
            self._log(progress)
        now = read_committed_state(self.table)
        before = self.committed.state
        reports = {
            pid: PartitionReport(
                partition_id=pid,
                status=LoadStatus.DRAINED
                if state.drained and not (before.get(pid) or state).drained
                else LoadStatus.LOADED,
                cursor=state.cursor,
                position=state.position,
                start_cursor=old.cursor if (old := before.get(pid)) else state.cursor,
                events=state.position - (old.position if old else 0),
                drained=state.drained,
                inherited_from=state.inherited_from,
                delta_version=now.delta_version,
            )
            for pid, state in now.state.partitions.items()
            if before.get(pid) != state
        }
        self.committed = now
        if not reports:
            return
        if self.table.form != "json":
            reports = self._counted(reports, before)
        self.context.log.info(
            "feed %s: committed %d events of partitions %s (Delta version %s)",
            self.binding.name,
            sum(r.events for r in reports.values()),
            sorted(reports),
            now.delta_version,
        )
        add_unknown_partitions(self.context.instance, self.binding, reports)
        outcome = LoadOutcome(reports, self.info, self.table, now)
        yield from materializations(self.binding, [*reports.values()], outcome)

    def _counted(self, reports: dict[int, PartitionReport], before: FeedState) -> dict[int, PartitionReport]:
        """A variant or columns table's `reports` with what the micro-batches committed of payloads Spark
        could not parse and rows with rescued values (counted in the table: `FeedTable.committed_counts`),
        and a columns table's columns as they are now and those the micro-batches added."""
        ranges = {
            pid: ((old.position if (old := before.get(pid)) else 0), report.position) for pid, report in reports.items()
        }
        counts = self.table.committed_counts(ranges)
        changes: dict[str, Any] = {}
        if self.table.form == "columns":
            columns = tuple(self.table.payload_columns())
            known = {c.name for c in self.table.written_columns} if self.table.written_columns is not None else None
            if known is not None:
                changes["columns_added"] = tuple(c.name for c in columns if c.name not in known)
            self.table.written_columns = columns
        counted = {
            pid: report.but(unparsed_payloads=counts[pid][0], rescued_values=counts[pid][1], **changes)
            for pid, report in reports.items()
        }
        for report in counted.values():
            for line in payload_warnings(self.binding.name, report):
                self.context.log.warning(line)
        return counted

    def _log(self, progress: dict) -> None:
        batch = progress.get("batchId")
        if batch is None or batch in self.logged_batches or not progress.get("durationMs", {}).get("addBatch"):
            return  # a trigger that found nothing new runs no micro-batch
        self.logged_batches.add(batch)
        durations = progress["durationMs"]
        self.context.log.info(
            "feed %s: micro-batch %s ran in %.1f s (reading the feed: %.1f s, committing to Delta: %.1f s)",
            self.binding.name,
            batch,
            durations.get("triggerExecution", 0) / 1000,
            durations.get("latestOffset", 0) / 1000,
            durations.get("addBatch", 0) / 1000,
        )
