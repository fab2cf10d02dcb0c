"""`FeedLoader`: plans a load from the cursors of record, has Spark read and write it.

A load of many partitions reads each event from the feed once and writes it once. Spark tasks read
the feed partitions through the `feedapi` data source (each task a group of partitions by expected
size, read concurrently, from their committed cursors; one discovery, the loader's, handed to them);
each partition's read ends with a checkpoint row saying where it stopped. `feed_read.FeedRead` hands
that read to the commit, in one of two shapes:

* **streamed** (a sync of an exactly-once feed, or of partitions holding no rows yet): one Spark job
  reads the feed and Spark's Delta writer appends the rows, in the **rows commit**, which carries the
  state the load started from with its partitions pending. Spark reports where the committed task
  attempts stopped (`observe`), and the **state commit** (no rows) carries that state. A load killed
  between the two resumes after the rows the rows commit added (`cursor_record.py`).
* **kept** (a rebuild, or at-least-once rows deduplicated against the table): Spark job 1 reads and
  keeps the read (`localCheckpoint`), its ends are collected, and one commit carries the rows (for a
  rebuild, replacing the partitions' rows) with the state they end at. If the kept blocks are lost
  (a dead executor), the load fails and commits nothing.

A run killed before a commit leaves nothing of it in the table; one killed after it resumes from
exactly the cursors that commit holds. At-least-once feeds are deduplicated in Spark against the
event ids the table holds (and within the read, in the tasks).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from feedapi_dagster.errors import KeptReadLost, RebuildAbandoned
from feedapi_dagster.lakehouse.cursor_record import CommittedState
from feedapi_dagster.lakehouse.feed_read import FeedRead, PartitionEnd, ReadEndsMissing
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.lakehouse.sink import DeltaSink
from feedapi_dagster.planning import (
    DEFAULT_TASKS,
    FeedState,
    PartitionPlan,
    PartitionState,
    PlanStatus,
    plan_feed,
    plan_rebuilds,
)
from feedapi_dagster.protocol import FeedClient, FeedInfo, FeedSettings
from feedapi_dagster.protocol.models import FIRST
from feedapi_dagster.read.datasource import EVENT_DDL, SOURCE_NAME, FeedSourceOptions
from feedapi_dagster.read.dedup import dedup_group, without_stored
from feedapi_dagster.read.progress import run_with_progress
from feedapi_dagster.read.registration import register_feed_source
from feedapi_dagster.spark.failures import is_kept_read_lost
from feedapi_dagster.spark.watchdog import DEFAULT_UNRESPONSIVE_SECONDS, answering

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

# Moments a load passes through, reported to `on_moment` (tests kill the process there).
READ = "read"  # a kept read, before its write
BEFORE_COMMIT = "before_commit"
ROWS_COMMITTED = "rows_committed"  # a streamed read's rows commit landed; its state commit follows
AFTER_COMMIT = "after_commit"


class LoadSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # A bound per partition and Spark job (its task stops at the first checkpoint past it): a sync
    # goes on with another job, and another commit, until the partition is caught up. None: one
    # job reads each partition to its current end. Rebuilds read whole partitions regardless.
    max_events_per_partition: int | None = Field(default=None, ge=1)
    # Spark tasks a load's read is spread over (partitions grouped by expected size); None: up to 16.
    read_tasks: int | None = Field(default=None, ge=1)
    # When the server's retention dropped events after a partition's cursor before they were read
    # (Nakadi): `stop` leaves the partition where it is, fails the load and its retention check, until
    # someone decides; `skip` accepts the loss and reads on from the oldest event still there (the
    # check fails for that load and names what was lost).
    retention_gap: Literal["stop", "skip"] = "stop"
    # A Spark Connect server that answers nothing for this long ends the load (`watchdog.py`): its
    # Dagster run fails and frees its slot instead of waiting for ever.
    spark_unresponsive_seconds: float = Field(default=DEFAULT_UNRESPONSIVE_SECONDS, ge=1)


@dataclass
class PartitionReport:
    """What one sync did to one partition (what a Dagster materialization records)."""

    partition_id: int
    status: str  # loaded | drained | waiting | invalid | failed
    cursor: str
    position: int
    start_cursor: str
    events: int = 0
    pages: int = 0
    duplicates: int = 0
    drained: bool = False
    rebuilt: bool = False
    inherited_from: int | None = None
    error: str | None = None
    delta_version: int | None = None
    bounded: bool = False  # the read stopped at `max_events_per_partition`: there may be more
    # the partition's own read: wall time from its first request to its checkpoint row (in a task that
    # reads it among others, while Spark writes what it read)
    read_seconds: float = 0.0
    # the load's wall time that read it, from the start of the Spark job to its commit (a partition's
    # own read is a small part of it: Spark's tasks, the write and the commits are the load's)
    load_seconds: float = 0.0
    gap: str | None = None  # events the server's retention dropped after the cursor, unread
    repeated_ids: int = 0  # ids an exactly-once feed sent more than once in this sync's reads (kept)
    repeated_examples: tuple[str, ...] = ()

    def then(self, later: PartitionReport) -> PartitionReport:
        """This report followed by a later load of the same partition in the same sync."""
        later.start_cursor = self.start_cursor
        later.events += self.events
        later.pages += self.pages
        later.duplicates += self.duplicates
        later.read_seconds += self.read_seconds
        later.load_seconds += self.load_seconds
        later.gap = later.gap or self.gap
        later.repeated_ids += self.repeated_ids
        later.repeated_examples = (*self.repeated_examples, *later.repeated_examples)[:5]
        return later


@dataclass(frozen=True)
class LoadOutcome:
    """What one load did: a report per partition, the discovery it planned from, the table it wrote and
    the cursor of record after it (what the Dagster layer records, checks and maintains)."""

    reports: dict[int, PartitionReport]
    info: FeedInfo
    table: FeedTable
    committed: CommittedState


class FeedLoader:
    def __init__(
        self,
        feed: FeedSettings,
        sink: DeltaSink,
        settings: LoadSettings | None = None,
        *,
        on_moment: Callable[[str, dict[int, PartitionState]], None] | None = None,
        logger: logging.Logger | logging.LoggerAdapter | None = None,
        ship_package: bool = False,
    ):
        """`logger`: where progress goes (a Dagster run passes `context.log`, so it shows live in the
        run's log). `ship_package`: send this package to the session's cluster with the data source
        (a cluster whose Python does not have feedapi-dagster installed)."""
        self.log = logger or log
        # the token is read here, in the run, and reaches the read tasks as Spark's redacted option
        self.feed = feed.with_token()
        self.client = FeedClient(self.feed)
        self.sink = sink
        self.spark = sink.table.spark
        self.settings = settings or LoadSettings()
        self.on_moment = on_moment or (lambda moment, updates: None)
        # the data source is registered here, where it is read, and nowhere else: every load (a
        # Dagster run, a test, a benchmark) reads through this loader, whoever made its session
        with self._answering():
            register_feed_source(self.spark, ship=ship_package, protocol=self.feed.protocol)

    def _answering(self):
        return answering(
            self.spark,
            f"the load of feed {self.feed.url}",
            unresponsive_seconds=self.settings.spark_unresponsive_seconds,
        )

    # ------------------------------------------------------------------ entry points
    def load(
        self,
        partitions: Iterable[int],
        *,
        rebuild: Iterable[int] = (),
        drop: Iterable[int] = (),
        rebuild_closed: bool = False,
    ) -> LoadOutcome:
        with self._answering():
            return self._load_all(list(partitions), rebuild, drop, rebuild_closed)

    def sync(self, partition_ids: Iterable[int] | None = None) -> dict[int, PartitionReport]:
        with self._answering():
            return self._sync(partition_ids)

    def rebuild(self, partition_ids: Iterable[int], drop: Iterable[int] = ()) -> dict[int, PartitionReport]:
        with self._answering():
            return self._rebuild(partition_ids, drop)

    def _load_all(
        self, partitions: list[int], rebuild: Iterable[int], drop: Iterable[int], rebuild_closed: bool
    ) -> LoadOutcome:
        """Bring `partitions` up to date: `rebuild` ones (and, with `rebuild_closed`, the closed ones
        among them: a backfill of a closed partition) from `_first` with their rows replaced, together
        with the rows of `drop`; the others from their cursors of record."""
        info = self.client.info
        partitions = list(partitions)
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
                {p.partition_id: _idle_report(p) for p in plans if not p.due and p.partition_id not in reports}
            )
            for pid, report in stopped.items():
                reports[pid] = reports[pid].then(report) if pid in reports else report
                loaded.add(pid)
            if not due:
                self._reassert_state()
                return dict(sorted(reports.items()))
            results = self._load(info, due, rebuild=False)
            for pid, gap in skipped.items():
                results[pid].gap = gap
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
                stopped[plan.partition_id] = PartitionReport(
                    plan.partition_id, "failed", plan.cursor, plan.position, plan.cursor, gap=gap, error=error
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
        reports = {p.partition_id: _idle_report(p) for p in plans if not p.due}
        due = [p for p in plans if p.due]
        if due:  # rows of `drop` go only together with the rebuilt rows that take their place
            reports.update(self._load(info, due, rebuild=True, drop=list(drop)))
        return dict(sorted(reports.items()))

    # ------------------------------------------------------------------ one load
    def _load(
        self, info: FeedInfo, plans: list[PartitionPlan], *, rebuild: bool, drop: Sequence[int] = ()
    ) -> dict[int, PartitionReport]:
        base = self.sink.committed_state()
        starts = {plan.partition_id: plan.start_state() for plan in plans}
        table = self.sink.table
        # At-least-once partitions with stored rows are deduplicated against them (a rebuild starts its
        # partitions, and the dropped ones, afresh; ancestors' rows stay). Partitions without rows (their
        # committed position is 0: rows and positions commit together) hold no id to repeat.
        replaced = {*starts, *drop} if rebuild else set()
        stored = {p for p, state in base.state.partitions.items() if state.position and p not in replaced}
        groups = {pid: [p for p in dedup_group(info, pid) if p in stored] for pid in starts}
        deduplicated = not info.exactly_once and any(groups.values())
        progress = table.progress_folder(uuid.uuid4().hex)
        # a rebuild replaces whole partitions in one commit: it is never cut short by the bound
        bound = None if rebuild else self.settings.max_events_per_partition
        started = time.monotonic()
        read = self._read(info, starts, progress, bound, keep=rebuild or deduplicated)
        try:
            if read.kept:
                reports = self._commit_kept(
                    read, plans, starts, base, groups if deduplicated else None, rebuild, drop, started
                )
            else:
                reports = self._commit_streamed(read, plans, starts, base, progress)
        finally:
            read.release()
            table.remove_progress(progress)
        for report in reports.values():
            report.load_seconds = time.monotonic() - started
        return reports

    def _read(
        self,
        info: FeedInfo,
        starts: dict[int, PartitionState],
        progress: str | None,
        max_events: int | None,
        *,
        keep: bool,
    ) -> FeedRead:
        """The read of `starts` by the `feedapi` source's tasks: streamed into the commit's Spark job, or
        (`keep`) Spark job 1, kept by Spark (`feed_read.py` says when and why)."""
        from pyspark import StorageLevel

        options = FeedSourceOptions(
            self.feed,
            partitions=tuple(sorted(starts)),
            start_cursors={pid: s.cursor for pid, s in starts.items()},
            start_positions={pid: s.position for pid, s in starts.items()},
            max_events=max_events,
            checkpoint_rows=True,
            discovery=info.only(starts),
            tasks=self._tasks(starts),
            progress_folder=progress,
        ).spark_options()
        source = self.spark.read.format(SOURCE_NAME).options(**options).load()
        if not keep:
            return FeedRead.streamed(source)
        # `localCheckpoint`, not `cache`: a cached read that lost a block would be read from the feed
        # again, and a second read may differ from the first (the feed grew, a retry): the cursors
        # committed must be those of the rows committed. On disk: memory stays bounded whatever the
        # load's size, and it is as fast as in memory (`benchmarks/README.md`).
        started = time.monotonic()
        kept = run_with_progress(
            lambda: source.localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY),
            progress,
            self._tasks(starts),
            self.log,
        )
        read = FeedRead.kept_from(kept)
        self.log.info("partitions %s: read and kept by Spark in %.1f s", sorted(starts), time.monotonic() - started)
        self.on_moment(READ, {})
        return read

    def _tasks(self, starts: dict[int, PartitionState]) -> int:
        return min(len(starts), self.settings.read_tasks or DEFAULT_TASKS)

    def _commit_streamed(
        self,
        read: FeedRead,
        plans: list[PartitionPlan],
        starts: dict[int, PartitionState],
        base: CommittedState,
        progress: str | None,
    ) -> dict[int, PartitionReport]:
        """One Spark job reads the feed and commits the rows (the rows commit: the state the load
        started from, its partitions pending), then the state they end at is committed."""
        expected = {pid: base.state.get(pid) for pid in starts}
        self.on_moment(BEFORE_COMMIT, starts)
        started = time.monotonic()
        rows_commit = run_with_progress(
            lambda: self.sink.commit(read.frame, starts, expected, pending=list(starts)),
            progress,
            self._tasks(starts),
            self.log,
        )
        version = rows_commit.delta_version
        assert version is not None  # `DeltaSink.commit` returns the state of the commit it landed
        self.on_moment(ROWS_COMMITTED, starts)
        ends = read.ends()
        if missing := sorted(set(starts) - set(ends)):  # cannot happen: a task that ended reports every partition
            raise ReadEndsMissing(
                f"partitions {missing}: Spark committed the rows (Delta version {version}) but "
                "reported no end of their reads; the next load resumes after their newest rows"
            )
        reports = {
            plan.partition_id: _report(plan, starts[plan.partition_id], ends[plan.partition_id], None, False)
            for plan in plans
        }
        ended = {
            pid: PartitionState(
                cursor=r.cursor, position=r.position, drained=r.drained, inherited_from=starts[pid].inherited_from
            )
            for pid, r in reports.items()
        }
        if ended == starts:  # nothing read: the rows commit (no row) leaves them where they are (`cursor_record.py`)
            self.log.info(
                "partitions %s: nothing new (Spark's read took %.1f s; its Delta version %s holds no rows)",
                sorted(starts),
                time.monotonic() - started,
                version,
            )
            return reports
        self._log_read(reports, f"read and written by Spark as Delta version {version}", time.monotonic() - started)
        rows_state = rows_commit.state  # rebased on others' commits, if any came first
        committing = time.monotonic()
        state_version = self.sink.commit_state(
            version, FeedState(generation=rows_state.generation, partitions={**rows_state.partitions, **ended})
        )
        self.on_moment(AFTER_COMMIT, ended)
        if state_version is not None:
            self.log.info(
                "cursors of partitions %s committed as Delta version %s in %.1f s",
                sorted(ended),
                state_version,
                time.monotonic() - committing,
            )
        for pid, report in reports.items():
            if ended[pid] != starts[pid] or report.events:
                report.delta_version = version if state_version is None else state_version
        return reports

    def _commit_kept(
        self,
        read: FeedRead,
        plans: list[PartitionPlan],
        starts: dict[int, PartitionState],
        base: CommittedState,
        groups: dict[int, list[int]] | None,
        rebuild: bool,
        drop: Sequence[int],
        started: float,
    ) -> dict[int, PartitionReport]:
        """The kept read's ends first, then its rows (deduplicated against the table where `groups`)
        and the state they end at in one commit. `started`: when the read began."""
        ends = read.ends()
        rows = read.frame()
        kept: dict[int, int] | None = None
        if groups is not None:
            rows, kept = without_stored(rows, self.sink.table.frame(base.rows_version), groups, starts)
        reports = {
            plan.partition_id: _report(plan, starts[plan.partition_id], ends.get(plan.partition_id), kept, rebuild)
            for plan in plans
        }
        self._log_read(reports, "read and kept by Spark", time.monotonic() - started)
        if rebuild:
            _check_nothing_expired(self.client.info, reports, base.state)
            failed = [r for r in reports.values() if r.status == "failed"]
            if failed:
                raise RebuildAbandoned(
                    f"rebuild of partitions {sorted(reports)} abandoned, nothing replaced: "
                    + "; ".join(f"partition {r.partition_id}: {r.error}" for r in failed)
                )
        updates = {}
        for pid, report in reports.items():
            state = PartitionState(
                cursor=report.cursor,
                position=report.position,
                drained=report.drained,
                inherited_from=starts[pid].inherited_from,
            )
            if rebuild or state != starts[pid] or report.events:
                updates[pid] = state
        if not updates and not rebuild:
            self.log.info("nothing to commit: partitions %s are where they were", sorted(reports))
            return reports
        expected = {pid: base.state.get(pid) for pid in updates}
        self.on_moment(BEFORE_COMMIT, updates)
        committing = time.monotonic()
        try:
            version = self.sink.commit(
                lambda: rows, updates, expected, replace=[*reports, *drop] if rebuild else []
            ).delta_version
        except Exception as error:  # noqa: BLE001 - Spark's error types differ between classic and Connect
            raise _explained(error, reports) from error
        self.on_moment(AFTER_COMMIT, updates)
        for pid in updates:
            reports[pid].delta_version = version
        self.log.info(
            "committed partitions %s as Delta version %s in %.1f s",
            sorted(updates),
            version,
            time.monotonic() - committing,
        )
        return reports

    def _log_read(self, reports: dict[int, PartitionReport], done: str, seconds: float) -> None:
        """`done`: what happened to the events in `seconds` (from the start of the read)."""
        # a line per partition for a few partitions; of thousands, only those with something to say
        # (each line is an event in Dagster's event log: ~3 ms each on SQLite)
        for report in reports.values():
            if report.repeated_ids:  # the feed broke its exactly-once promise: the duplicate-id check fails
                self.log.warning(
                    "partition %s: the feed sent %d event ids more than once (e.g. %s); they were written as sent",
                    report.partition_id,
                    report.repeated_ids,
                    ", ".join(report.repeated_examples),
                )
            if report.duplicates or report.error or len(reports) <= 32:
                self.log.info(
                    "partition %s: %d events in %d pages%s, cursor %s",
                    report.partition_id,
                    report.events,
                    report.pages,
                    f" ({report.duplicates} duplicates skipped)" if report.duplicates else "",
                    report.cursor,
                )
        events = sum(r.events for r in reports.values())
        self.log.info(
            "%d events in %d pages from %d partitions %s in %.1f s (%.0f events/s)",
            events,
            sum(r.pages for r in reports.values()),
            len(reports),
            done,
            seconds,
            events / max(seconds, 1e-9),
        )

    def _reassert_state(self) -> None:
        """Commit the state again, with no rows, when it was recovered from the rows or others' commits
        pushed its commit far back: Delta's log cleanup never reaches it while the feed is loaded."""
        base = self.sink.committed_state()
        if not base.due_for_reassertion:
            return
        version = self.sink.commit(lambda: self.spark.createDataFrame([], EVENT_DDL), {}, {}).delta_version
        self.log.info("feed state (%s) committed again as Delta version %s", base.describe(), version)


def _explained(error: Exception, partitions) -> Exception:
    """Spark's error for a kept read lost with its executor, said as what it means for the load."""
    if is_kept_read_lost(error):
        return KeptReadLost(
            f"partitions {sorted(partitions)}: the read Spark kept was lost before the Delta write "
            "(an executor holding it died); nothing was committed, and the next load reads these "
            "partitions again from their cursors of record"
        )
    return error


def _check_nothing_expired(info: FeedInfo, reports: dict[int, PartitionReport], committed) -> None:
    """A rebuild re-reads what the server holds now: where its retention dropped events (Nakadi), that
    is fewer than the table holds, and replacing the rows would lose the others."""
    shrunk = [
        f"partition {pid}: {report.position} events read, the table holds {state.position}"
        for pid, report in reports.items()
        if (partition := info.partition(pid)) is not None
        and partition.oldest_available is not None
        and (state := committed.get(pid)) is not None
        and report.position < state.position
    ]
    if shrunk:
        raise RebuildAbandoned(
            f"rebuild of partitions {sorted(reports)} abandoned, nothing replaced: the server "
            "no longer holds every event the table has (its retention dropped some): " + "; ".join(shrunk)
        )


def _report(
    plan: PartitionPlan, start: PartitionState, end: PartitionEnd | None, kept: dict[int, int] | None, rebuild: bool
) -> PartitionReport:
    report = PartitionReport(
        plan.partition_id,
        "loaded",
        start.cursor,
        start.position,
        start.cursor,
        rebuilt=rebuild,
        inherited_from=plan.inherited_from,
    )
    if end is None:  # cannot happen with a whole read; never commit a guess
        report.status, report.error = "failed", "the read of this partition left no checkpoint row"
        return report
    cursor, read = end.cursor, end.read
    events = read.events if kept is None else kept.get(plan.partition_id, 0)
    report.cursor, report.position = cursor, start.position + events
    report.events, report.pages, report.drained = events, read.pages, read.drained
    report.duplicates = read.duplicates + (read.events - events)
    report.bounded = read.bounded
    report.read_seconds = read.seconds
    report.repeated_ids, report.repeated_examples = read.repeated_ids, read.repeated_examples
    if read.error:
        report.status, report.error = "failed", read.error
    return report


def _idle_report(plan: PartitionPlan) -> PartitionReport:
    return PartitionReport(
        plan.partition_id,
        plan.status.value,
        plan.cursor,
        plan.position,
        plan.cursor,
        drained=plan.status is PlanStatus.DRAINED,
        error=plan.reason or None,
    )
