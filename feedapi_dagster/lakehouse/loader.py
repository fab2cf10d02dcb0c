"""`FeedLoader`: what a batch load of a feed reads: it plans from the cursors of record which
partitions to read (a sync's waves, a rebuild's partitions, past retention gaps) and has
`load_execution.LoadExecution` read and commit them.

A load of many partitions reads each event from the feed once and writes it once. A run killed before
a commit leaves nothing of it in the table; one killed after it resumes from exactly the cursors that
commit holds. At-least-once feeds are deduplicated in Spark against the event ids the table holds (and
within the read, in the tasks).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from feedapi_dagster.errors import RebuildAbandoned
from feedapi_dagster.lakehouse.commit import Moment, ReadCommit
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.lakehouse.load_execution import LoadExecution
from feedapi_dagster.lakehouse.load_report import LoadOutcome, LoadStatus, PartitionReport, idle_report
from feedapi_dagster.lakehouse.load_settings import LoadSettings
from feedapi_dagster.lakehouse.sink import DeltaSink
from feedapi_dagster.planning import PartitionPlan, PartitionState, plan_feed, plan_rebuilds
from feedapi_dagster.protocol import FeedClient, FeedInfo, FeedSettings
from feedapi_dagster.protocol.models import FIRST
from feedapi_dagster.read.registration import register_feed_source
from feedapi_dagster.spark.watchdog import answering

log = logging.getLogger(__name__)


class FeedLoader:
    def __init__(
        self,
        feed: FeedSettings,
        sink: DeltaSink,
        settings: LoadSettings | None = None,
        *,
        on_moment: Moment | None = None,
        logger: logging.Logger | logging.LoggerAdapter | None = None,
        ship_package: bool = False,
    ):
        """`logger`: where progress goes (a Dagster run passes `context.log`, so it shows live in the
        run's log). `ship_package`: send this package to the session's cluster with the data source
        (a cluster whose Python does not have feedapi-dagster installed)."""
        # the token is read here, in the run, and reaches the read tasks as Spark's redacted option
        self.feed = feed.with_token()
        self.client = FeedClient(self.feed)
        self.sink = sink
        self.spark = sink.table.spark
        self.settings = settings or LoadSettings()
        self.ship_package = ship_package
        self._declared_asked = False  # a columns table's server-declared types: asked once per loader
        self.execution = LoadExecution(
            self.feed, sink, self.settings, on_moment=on_moment or (lambda moment, updates: None), logger=logger or log
        )

    @property
    def log(self) -> logging.Logger | logging.LoggerAdapter:
        """Where the load's progress goes: the planning's lines and its execution's are one log."""
        return self.execution.log

    @log.setter
    def log(self, logger: logging.Logger | logging.LoggerAdapter) -> None:
        self.execution.log = logger

    @classmethod
    def into(
        cls,
        table: FeedTable,
        feed: FeedSettings,
        settings: LoadSettings,
        *,
        run_id: str | None,
        logger: logging.Logger | logging.LoggerAdapter | None = None,
        ship_package: bool = False,
    ) -> FeedLoader:
        """The loader of `feed` into `table` (created where there is none: `DeltaSink`), its Spark
        calls bounded by `settings.spark_unresponsive_seconds` from the first; `run_id`: what its
        commits are stamped with."""
        with answering(
            table.spark, f"the table of feed {feed.url}", unresponsive_seconds=settings.spark_unresponsive_seconds
        ):
            sink = DeltaSink(table, run_id=run_id)
        return FeedLoader(feed, sink, settings, logger=logger, ship_package=ship_package)

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """The block's calls to Spark bounded by `settings.spark_unresponsive_seconds` (`answering`), with
        the `feedapi` data source in the session: it is registered where a read starts (here for a batch
        load, in `FeedStream` for a stream): every load (a Dagster run, a test, a benchmark) reads
        through a loader's entry point, whoever made its session."""
        with answering(
            self.spark,
            f"the load of feed {self.feed.url}",
            unresponsive_seconds=self.settings.spark_unresponsive_seconds,
        ):
            register_feed_source(self.spark, ship=self.ship_package, protocol=self.feed.protocol)
            table = self.sink.table
            if table.form == "columns" and not self._declared_asked:
                table.declare(self.client.declared_columns(), self.log)
                self._declared_asked = True
            yield

    # ------------------------------------------------------------------ entry points
    def load(
        self,
        partitions: Iterable[int] | None,
        *,
        rebuild: Iterable[int] = (),
        drop: Iterable[int] = (),
        rebuild_closed: bool = False,
    ) -> LoadOutcome:
        """Bring `partitions` (None: every partition the feed's discovery lists) up to date (`_load_all`)."""
        with self._reading():
            return self._load_all(None if partitions is None else list(partitions), rebuild, drop, rebuild_closed)

    def sync(self, partition_ids: Iterable[int] | None = None) -> dict[int, PartitionReport]:
        with self._reading():
            return self._sync(partition_ids)

    def rebuild(self, partition_ids: Iterable[int], drop: Iterable[int] = ()) -> dict[int, PartitionReport]:
        with self._reading():
            return self._rebuild(partition_ids, drop)

    def _load_all(
        self, partitions: list[int] | None, rebuild: Iterable[int], drop: Iterable[int], rebuild_closed: bool
    ) -> LoadOutcome:
        """Bring `partitions` up to date: `rebuild` ones (and, with `rebuild_closed`, the closed ones
        among them: a backfill of a closed partition) from `_first` with their rows replaced, together
        with the rows of `drop`; the others from their cursors of record."""
        info = self.client.info
        if partitions is None:
            partitions = [p.id for p in info.partitions]
        rebuilt = set(rebuild)
        if rebuild_closed:
            rebuilt |= {pid for pid in partitions if (p := info.partition(pid)) is not None and p.closed}
        reports: dict[int, PartitionReport] = {}
        if rebuilt:
            self.log.info("partitions %s: rebuilding from _first (rows replaced atomically)", sorted(rebuilt))
            reports.update(self._rebuild(sorted(rebuilt), drop=list(drop)))
        synced = [pid for pid in partitions if pid not in rebuilt]
        if synced:
            reports.update(self._sync(synced))
        return LoadOutcome(
            dict(sorted(reports.items())), info, self.sink.table, self.sink.committed_state(refresh=True)
        )

    def _sync(self, partition_ids: Iterable[int] | None = None) -> dict[int, PartitionReport]:
        """Load every due partition (or the given ones) to where the feed is now.

        Method-1 children whose parent drains during this sync are loaded in a later wave of the
        same sync, so one scheduled run catches up a whole split.
        """
        info = self.client.info
        wanted = set(partition_ids) if partition_ids is not None else None
        reports: dict[int, PartitionReport] = {}
        loaded: set[int] = set()
        while True:
            plans = [
                p
                for p in plan_feed(info, self.sink.state)
                if (wanted is None or p.partition_id in wanted) and p.partition_id not in loaded
            ]
            due, stopped, skipped = self._past_retention_gaps(info, [p for p in plans if p.due])
            reports.update(
                {p.partition_id: idle_report(p) for p in plans if not p.due and p.partition_id not in reports}
            )
            for pid, report in stopped.items():
                reports[pid] = reports[pid].then(report) if pid in reports else report
                loaded.add(pid)
            if not due:
                self._reassert_state(info)
                return dict(sorted(reports.items()))
            results = self.execution.run(info, due, rebuild=False)
            for pid, gap in skipped.items():
                results[pid] = results[pid].but(gap=gap)
            for pid, report in results.items():
                reports[pid] = reports[pid].then(report) if pid in reports else report
            loaded.update(pid for pid, report in results.items() if not report.bounded)

    def _past_retention_gaps(
        self, info: FeedInfo, due: list[PartitionPlan]
    ) -> tuple[list[PartitionPlan], dict[int, PartitionReport], dict[int, str]]:
        """Where the server's retention dropped events after a partition's cursor, unread: the plans to
        read, a failed report for each partition left at its cursor (`retention_gap: stop`), and what
        was lost of each that reads on from the oldest event left (`skip`)."""
        kept, stopped, skipped = [], {}, {}
        for plan in due:
            gap = self.client.protocol.retention_gap(info.partition(plan.partition_id), plan.cursor)
            if gap is None:
                kept.append(plan)
            elif self.settings.retention_gap == "skip":
                self.log.warning("%s; reading on from the oldest available event (load.retention_gap: skip)", gap)
                kept.append(plan.model_copy(update={"cursor": FIRST}))
                skipped[plan.partition_id] = gap
            else:
                error = (
                    f"{gap}; the partition stays at its cursor until the loss is accepted "
                    "(load.retention_gap: skip) or the events are restored"
                )
                self.log.error("%s", error)
                stopped[plan.partition_id] = PartitionReport.unmoved(
                    partition_id=plan.partition_id,
                    status=LoadStatus.FAILED,
                    state=PartitionState(cursor=plan.cursor, position=plan.position),
                    gap=gap,
                    error=error,
                )
        return kept, stopped, skipped

    def _rebuild(self, partition_ids: Iterable[int], drop: Iterable[int] = ()) -> dict[int, PartitionReport]:
        """Reload partitions from `_first` and replace their rows (and the rows of `drop`, e.g. the
        vanished parent of a method-2 split) in one commit: readers never see a half-rebuilt table."""
        info = self.client.info
        partitions = []
        for partition_id in partition_ids:
            partition = info.partition(partition_id)
            if partition is None:
                raise RebuildAbandoned(f"partition {partition_id} is not in discovery; it cannot be rebuilt")
            partitions.append(partition)
        plans = plan_rebuilds(info, self.sink.state, partitions, list(drop))
        reports = {p.partition_id: idle_report(p) for p in plans if not p.due}
        due = [p for p in plans if p.due]
        if due:  # rows of `drop` go only together with the rebuilt rows that take their place
            reports.update(self.execution.run(info, due, rebuild=True, drop=list(drop)))
        return dict(sorted(reports.items()))

    def _reassert_state(self, info: FeedInfo) -> None:
        """Commit the state again, with no rows, when it was recovered from the rows or others' commits
        pushed its commit far back: Delta's log cleanup never reaches it while the feed is loaded."""
        base = self.sink.committed_state()
        if not base.due_for_reassertion:
            return
        version = ReadCommit(self.sink, info, on_moment=self.execution.on_moment).commit_state_again()
        self.log.info("feed state (%s) committed again as Delta version %s", base.describe(), version)
