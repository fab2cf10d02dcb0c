"""`ReadCommit`: THE commit of a read, the batch loads' (`load_execution.py`) and the Dagster stream's
micro-batches' (`feed_stream.py`): a read's rows and where each partition's read ended, committed
through `DeltaSink` with the cursor of record they end at (`cursor_record.py`).

Two shapes, by what is known before the write (`feed_read.py` says when each is used):

* **one commit** (`stage`, then `commit`): the read is kept (a kept load, a micro-batch), its ends are
  known first. At-least-once rows are deduplicated against the event ids the table holds (the
  partitions' dedup groups), positions renumbered; the rows and the states they end at land in one
  Delta commit.
* **rows commit** (`commit_rows`), **then a state commit only where the rows cannot say the ends**
  (`commit_ends`): a streamed read, whose ends are known only once Spark has written its rows. The
  rows commit names its partitions pending: each resumes after its newest row in that commit
  (`cursor_record.py`). That is where the read stopped unless the read moved a cursor past its last
  row (pages without events) or drained a closed partition: only then does a state commit follow.

And the state alone again (`commit_state_again`, no rows, nothing moves): a loader's, so that Delta's
log cleanup never reaches the commit holding the state (`CommittedState.due_for_reassertion`).

The dangerous moments are reported to `on_moment` (tests kill the process there): `BEFORE_COMMIT`,
`ROWS_COMMITTED` (a streamed read's rows commit landed), `AFTER_COMMIT` (after the rows commit too,
where no state commit follows); `READ` is the load's
(a kept read, before anything of its commit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from feedapi_dagster.errors import KeptReadLost
from feedapi_dagster.lakehouse.cursor_record import CommittedState
from feedapi_dagster.lakehouse.feed_read import FeedRead, PartitionEnd, ReadEndsMissing
from feedapi_dagster.lakehouse.sink import DeltaSink
from feedapi_dagster.planning import FeedState, PartitionState
from feedapi_dagster.protocol import FeedInfo
from feedapi_dagster.read.datasource import EVENT_DDL
from feedapi_dagster.read.dedup import dedup_group, without_stored
from feedapi_dagster.spark.failures import is_kept_read_lost

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

# Moments a commit passes through, reported to `on_moment` (tests kill the process there).
READ = "read"  # a kept read, before its write
BEFORE_COMMIT = "before_commit"
ROWS_COMMITTED = "rows_committed"  # a streamed read's rows commit landed; a state commit may follow
AFTER_COMMIT = "after_commit"

Moment = Callable[[str, dict[int, PartitionState]], None]


@dataclass(frozen=True, kw_only=True)
class PartitionAdvance:
    """How far the read of one partition took it, as its commit needs it (from a batch load's
    `feed_read.PartitionEnd`, or from a micro-batch's offsets)."""

    cursor: str  # where the read ended
    events: int  # events read, before deduplication against the table
    drained: bool


@dataclass(frozen=True, kw_only=True)
class StagedCommit:
    """A kept read ready to commit: its rows (deduplicated) and where each partition they hold ends."""

    rows: DataFrame
    states: dict[int, PartitionState]  # each read partition's state after its rows
    written: dict[int, int]  # each read partition's events among the rows


@dataclass(frozen=True, kw_only=True)
class RowsCommit:
    """A streamed read's rows commit: the state it carries (its partitions pending) and where each
    partition's read ended, as Spark reported it for the rows it committed."""

    landed: CommittedState
    ends: dict[int, PartitionEnd]

    @property
    def delta_version(self) -> int:
        assert self.landed.delta_version is not None  # `DeltaSink.commit` returns the commit it landed
        return self.landed.delta_version


def rows_say(rows_commit: RowsCommit, ended: Mapping[int, PartitionState]) -> bool:
    """Whether the state each of the rows commit's partitions ended at is the one its rows give it
    (`cursor_record._with_pending_rows`): after its newest row (that row's page cursor, the position
    after it), or at its start where it wrote none. Not so where the read moved the cursor past its last
    row (pages without events) or drained a closed partition: a state commit must say that."""
    starts = rows_commit.landed.state
    for pid, state in ended.items():
        start = starts.get(pid) or PartitionState()
        end = rows_commit.ends[pid].read
        from_rows = (
            start
            if not end.events
            else PartitionState(
                cursor=end.last_row_cursor or "",
                position=start.position + end.events,
                inherited_from=start.inherited_from,
            )
        )
        if state != from_rows:
            return False
    return True


def state_after(start: PartitionState, *, cursor: str, events: int, drained: bool) -> PartitionState:
    """A partition's state after `events` rows written from `start`, its read ended at `cursor`."""
    return PartitionState(
        cursor=cursor, position=start.position + events, drained=drained, inherited_from=start.inherited_from
    )


class ReadCommit:
    """Commits reads of a feed (`info`: its discovery, for its exactly-once promise and its method-2
    ancestry) into the sink's table."""

    def __init__(self, sink: DeltaSink, info: FeedInfo, *, on_moment: Moment | None = None):
        self.sink = sink
        self.info = info
        self.on_moment = on_moment or (lambda moment, updates: None)

    def dedup_groups(
        self, partitions: Collection[int], base: CommittedState, *, replaced: Collection[int] = ()
    ) -> dict[int, list[int]] | None:
        """The partitions whose stored rows each of `partitions` is deduplicated against; None where
        nothing is (an exactly-once feed, or no stored row to repeat). `replaced`: partitions whose rows
        the commit replaces (a rebuild starts them afresh). Partitions without rows (committed position
        0: rows and positions commit together) hold no id to repeat."""
        if self.info.exactly_once:
            return None
        stored = {p for p, state in base.state.partitions.items() if state.position and p not in replaced}
        groups = {pid: [p for p in dedup_group(self.info, pid) if p in stored] for pid in partitions}
        return groups if any(groups.values()) else None

    # ------------------------------------------------------------------ one commit (a kept read)
    def stage(
        self,
        rows: DataFrame,
        starts: Mapping[int, PartitionState],
        advances: Mapping[int, PartitionAdvance],
        base: CommittedState,
        *,
        replaced: Collection[int] = (),
    ) -> StagedCommit:
        """The rows of the partitions read from `starts` by `advances`, deduplicated against the table at
        `base` where `dedup_groups` says, and the states they end at."""
        groups = self.dedup_groups(list(starts), base, replaced=replaced)
        if groups is None:
            written = {pid: advance.events for pid, advance in advances.items()}
        else:
            rows, kept = without_stored(rows, self.sink.table.frame(base.rows_version), groups, dict(starts))
            written = {pid: kept.get(pid, 0) for pid in advances}
        states = {
            pid: state_after(starts[pid], cursor=advance.cursor, events=written[pid], drained=advance.drained)
            for pid, advance in advances.items()
        }
        return StagedCommit(rows=rows, states=states, written=written)

    def commit(
        self,
        rows: DataFrame,
        updates: dict[int, PartitionState],
        base: CommittedState,
        *,
        replace: Sequence[int] = (),
    ) -> int:
        """The rows and the partitions' new states (`updates`, continuing from `base`) in one Delta
        commit (for `replace` partitions, their rows replaced); its Delta version."""
        expected = {pid: base.state.get(pid) for pid in updates}
        self.on_moment(BEFORE_COMMIT, updates)
        try:
            landed = self.sink.commit(lambda: rows, updates, expected, replace=replace)
        except Exception as error:  # noqa: BLE001 - Spark's error types differ between classic and Connect
            raise _explained(error, updates) from error
        self.on_moment(AFTER_COMMIT, updates)
        assert landed.delta_version is not None  # `DeltaSink.commit` returns the commit it landed
        return landed.delta_version

    # ------------------------------------------------------------------ a streamed read's two commits
    def commit_rows(
        self,
        read: FeedRead,
        starts: dict[int, PartitionState],
        base: CommittedState,
        *,
        running: Callable[[Callable[[], CommittedState]], CommittedState] = lambda write: write(),
    ) -> RowsCommit:
        """One Spark job reads the feed and commits its rows with the state the read started from, its
        partitions pending (`running`: how the job is run, e.g. with its tasks' progress shown)."""
        expected = {pid: base.state.get(pid) for pid in starts}
        self.on_moment(BEFORE_COMMIT, starts)
        landed = running(lambda: self.sink.commit(read.frame, starts, expected, pending=list(starts)))
        self.on_moment(ROWS_COMMITTED, starts)
        ends = read.ends()
        if missing := sorted(set(starts) - set(ends)):  # cannot happen: a task that ended reports every partition
            raise ReadEndsMissing(
                f"partitions {missing}: Spark committed the rows (Delta version {landed.delta_version}) but "
                "reported no end of their reads; the next load resumes after their newest rows"
            )
        return RowsCommit(landed=landed, ends=ends)

    def commit_ends(self, rows_commit: RowsCommit, ended: dict[int, PartitionState]) -> int | None:
        """The state a rows commit's partitions end at (`ended`): where its rows say it (`rows_say`),
        nothing more is committed and this is the rows commit's Delta version; else the state is
        committed after it: its Delta version, or None where another load committed after the rows
        first (the rows then hold the ends, and the pages after them no event)."""
        if rows_say(rows_commit, ended):
            self.on_moment(AFTER_COMMIT, ended)
            return rows_commit.delta_version
        rows_state = rows_commit.landed.state  # rebased on others' commits, if any came first
        version = self.sink.commit_state(
            rows_commit.delta_version,
            FeedState(generation=rows_state.generation, partitions={**rows_state.partitions, **ended}),
        )
        self.on_moment(AFTER_COMMIT, ended)
        return version

    # ------------------------------------------------------------------ the state again, no rows
    def commit_state_again(self) -> int:
        """The committed state again, in a commit without rows that moves no partition: its Delta version."""
        self.on_moment(BEFORE_COMMIT, {})
        landed = self.sink.commit(lambda: self.sink.table.spark.createDataFrame([], EVENT_DDL), {}, {})
        self.on_moment(AFTER_COMMIT, {})
        assert landed.delta_version is not None  # `DeltaSink.commit` returns the commit it landed
        return landed.delta_version


def _explained(error: Exception, partitions: Collection[int]) -> Exception:
    """Spark's error for a kept read lost with its executor, said as what it means for the load."""
    if is_kept_read_lost(error):
        return KeptReadLost(
            f"partitions {sorted(partitions)}: the read Spark kept was lost before the Delta write "
            "(an executor holding it died); nothing was committed, and the next load reads these "
            "partitions again from their cursors of record"
        )
    return error
