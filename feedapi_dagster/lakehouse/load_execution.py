"""`LoadExecution`: one planned load of a feed's due partitions, read by Spark and committed.

Spark tasks read the feed partitions through the `feedapi` data source (each task a group of
partitions by expected size, read concurrently, from their committed cursors; one discovery, the
loader's, handed to them); each partition's read ends with a checkpoint row saying where it stopped.
`feed_read.FeedRead` hands that read to the commit (`commit.ReadCommit`), in one of two shapes:

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
exactly the cursors that commit holds.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from feedapi_dagster.errors import RebuildAbandoned
from feedapi_dagster.lakehouse.commit import READ, Moment, PartitionAdvance, ReadCommit, RowsCommit
from feedapi_dagster.lakehouse.cursor_record import CommittedState
from feedapi_dagster.lakehouse.feed_read import FeedRead
from feedapi_dagster.lakehouse.load_report import LoadStatus, PartitionReport, read_report
from feedapi_dagster.lakehouse.load_settings import LoadSettings
from feedapi_dagster.lakehouse.payload_form import DATA_COLUMN, UnparsedCountMissing, data_column
from feedapi_dagster.lakehouse.sink import DeltaSink
from feedapi_dagster.planning import DEFAULT_TASKS, FeedState, PartitionPlan, PartitionState
from feedapi_dagster.planning.payload_columns import RESCUE_COLUMN
from feedapi_dagster.protocol import FeedInfo, FeedSettings
from feedapi_dagster.read.datasource import SOURCE_NAME, FeedSourceOptions
from feedapi_dagster.read.progress import run_with_progress


@dataclass(frozen=True)
class _ReadToCommit:
    """A read of planned partitions on its way to the commit: what either shape commits it with."""

    committer: ReadCommit
    read: FeedRead
    plans: list[PartitionPlan]
    starts: dict[int, PartitionState]  # where each partition's read began
    base: CommittedState  # the committed state the load read first


class LoadExecution:
    """Loads planned partitions of `feed` into the sink's table (`FeedLoader` plans them)."""

    def __init__(
        self,
        feed: FeedSettings,
        sink: DeltaSink,
        settings: LoadSettings,
        *,
        on_moment: Moment,
        logger: logging.Logger | logging.LoggerAdapter,
    ):
        self.feed = feed
        self.sink = sink
        self.spark = sink.table.spark
        self.settings = settings
        self.on_moment = on_moment
        self.log = logger

    def run(
        self, info: FeedInfo, plans: list[PartitionPlan], *, rebuild: bool, drop: Sequence[int] = ()
    ) -> dict[int, PartitionReport]:
        """Read `plans`' partitions from their starts and commit them (`rebuild`: from `_first`, their
        rows and those of `drop` replaced in one commit); a report per partition."""
        base = self.sink.committed_state()
        starts = {plan.partition_id: plan.start_state() for plan in plans}
        table = self.sink.table
        committer = ReadCommit(self.sink, info, on_moment=self.on_moment)
        # a rebuild starts its partitions, and the dropped ones, afresh; ancestors' rows stay
        replaced = {*starts, *drop} if rebuild else set()
        deduplicated = committer.dedup_groups(list(starts), base, replaced=replaced) is not None
        progress = table.progress_folder(uuid.uuid4().hex)
        # a rebuild replaces whole partitions in one commit: it is never cut short by the bound
        bound = None if rebuild else self.settings.max_events_per_partition
        started = time.monotonic()
        # a columns table's write looks at its rows before it writes them (`typed_columns.py`): kept, so
        # that the feed is read once
        keep = rebuild or deduplicated or table.form == "columns"
        read = self._read(info, starts, progress, bound, keep=keep)
        try:
            done = _ReadToCommit(committer, read, plans, starts, base)
            if read.kept:
                reports = self._commit_kept(done, rebuild, drop, started)
            else:
                reports = self._commit_streamed(done, progress)
        finally:
            read.release()
            table.remove_progress(progress)
        load_seconds = time.monotonic() - started
        return {pid: report.but(load_seconds=load_seconds) for pid, report in reports.items()}

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
        if self.sink.table.form == "columns":  # parsed once, kept parsed: the write looks at it twice
            source = source.withColumn(DATA_COLUMN, data_column())
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

    def _commit_streamed(self, done: _ReadToCommit, progress: str | None) -> dict[int, PartitionReport]:
        """One Spark job reads the feed and commits the rows (the rows commit: the state the load
        started from, its partitions pending); then the state they end at, where the rows cannot say it."""
        committer, read, plans, starts, base = done.committer, done.read, done.plans, done.starts, done.base
        started = time.monotonic()
        rows_commit: RowsCommit = committer.commit_rows(
            read, starts, base, running=lambda write: run_with_progress(write, progress, self._tasks(starts), self.log)
        )
        version = rows_commit.delta_version
        reports = {}
        for plan in plans:
            end = rows_commit.ends[plan.partition_id]
            reports[plan.partition_id] = read_report(
                plan, starts[plan.partition_id], end, end.read.events, rebuilt=False
            )
        reports = self._counted(reports, version)
        ended = {pid: r.state() for pid, r in reports.items()}
        if ended == starts:  # nothing read: the rows commit (no row) leaves them where they are (`cursor_record.py`)
            self.log.info(
                "partitions %s: nothing new (Spark's read took %.1f s; its Delta version %s holds no rows)",
                sorted(starts),
                time.monotonic() - started,
                version,
            )
            return reports
        self._log_read(reports, f"read and written by Spark as Delta version {version}", time.monotonic() - started)
        committing = time.monotonic()
        state_version = committer.commit_ends(rows_commit, ended)
        if state_version == version:
            self.log.info("cursors of partitions %s: in their rows of Delta version %s", sorted(ended), version)
        elif state_version is not None:
            self.log.info(
                "cursors of partitions %s committed as Delta version %s in %.1f s",
                sorted(ended),
                state_version,
                time.monotonic() - committing,
            )
        landed_in = version if state_version is None else state_version
        return {
            pid: report.but(delta_version=landed_in) if ended[pid] != starts[pid] or report.events else report
            for pid, report in reports.items()
        }

    def _commit_kept(
        self, done: _ReadToCommit, rebuild: bool, drop: Sequence[int], started: float
    ) -> dict[int, PartitionReport]:
        """The kept read's ends first, then its rows (deduplicated against the table where the feed is
        at-least-once) and the state they end at in one commit. `started`: when the read began."""
        committer, read, plans, starts, base = done.committer, done.read, done.plans, done.starts, done.base
        ends = read.ends()
        advances = {
            pid: PartitionAdvance(cursor=end.cursor, events=end.read.events, drained=end.read.drained)
            for pid, end in ends.items()
            if pid in starts
        }
        staged = committer.stage(read.frame(), starts, advances, base, replaced={*starts, *drop} if rebuild else ())
        reports = {
            plan.partition_id: read_report(
                plan,
                starts[plan.partition_id],
                ends.get(plan.partition_id),
                staged.written.get(plan.partition_id, 0),
                rebuilt=rebuild,
            )
            for plan in plans
        }
        self._log_read(reports, "read and kept by Spark", time.monotonic() - started)
        if rebuild:
            _check_nothing_expired(committer.info, reports, base.state)
            failed = [r for r in reports.values() if r.status is LoadStatus.FAILED]
            if failed:
                raise RebuildAbandoned(
                    f"rebuild of partitions {sorted(reports)} abandoned, nothing replaced: "
                    + "; ".join(f"partition {r.partition_id}: {r.error}" for r in failed)
                )
        states = {pid: report.state() for pid, report in reports.items()}
        updates = {
            pid: state for pid, state in states.items() if rebuild or state != starts[pid] or reports[pid].events
        }
        if not updates and not rebuild:
            self.log.info("nothing to commit: partitions %s are where they were", sorted(reports))
            return self._counted(reports, None)
        committing = time.monotonic()
        version = committer.commit(staged.rows, updates, base, replace=[*reports, *drop] if rebuild else [])
        reports = self._counted(reports, version)
        self.log.info(
            "committed partitions %s as Delta version %s in %.1f s",
            sorted(updates),
            version,
            time.monotonic() - committing,
        )
        return {pid: r.but(delta_version=version) if pid in updates else r for pid, r in reports.items()}

    def _counted(self, reports: dict[int, PartitionReport], version: int | None) -> dict[int, PartitionReport]:
        """A variant or columns table's `reports` with what the write job of the commit that just landed
        (Delta version `version`; None: no commit, nothing counted) counted of its partitions' rows
        (`payload_form.FormCounts`): payloads Spark could not parse and (columns) rows with rescued values;
        None where Spark did not report them. A columns table's: the columns the commit added."""
        form = self.sink.table.form
        if form == "json":
            return reports
        written = self.sink.landed_written if version is not None else None
        unparsed: dict[int, int] | None = {}
        rescued: dict[int, int] | None = {}
        if version is not None:
            try:
                if written is None:
                    raise UnparsedCountMissing("its write raised after it landed")
                unparsed, rescued = written.counts.unparsed(), written.counts.rescued()
            except UnparsedCountMissing as error:
                unparsed = rescued = None
                self.log.warning(
                    "Delta version %s: how many of its rows have payloads Spark could not parse%s is not known "
                    "(%s); `WHERE %s` finds them",
                    version,
                    " or rescued values" if form == "columns" else "",
                    error,
                    f"{RESCUE_COLUMN} IS NOT NULL" if form == "columns" else "data IS NULL AND payload IS NOT NULL",
                )
        added = tuple(column.name for column in written.added) if written else ()
        extended = tuple(column.name for column in written.extended) if written else ()
        if written and (written.added or written.extended):
            changes = [f"added the payload columns {', '.join(f'{c.name} {c.type.ddl()}' for c in written.added)}"]
            changes = changes[: bool(written.added)] + [f"gave new fields to {', '.join(extended)}"][: bool(extended)]
            self.log.info("Delta version %s %s", version, " and ".join(changes))
        return {
            pid: report.but(
                unparsed_payloads=None if unparsed is None else unparsed.get(pid, 0),
                **(
                    {
                        "rescued_values": None if rescued is None else rescued.get(pid, 0),
                        "columns_added": added,
                        "columns_extended": extended,
                    }
                    if form == "columns"
                    else {}
                ),
            )
            for pid, report in reports.items()
        }

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


def _check_nothing_expired(info: FeedInfo, reports: dict[int, PartitionReport], committed: FeedState) -> None:
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
