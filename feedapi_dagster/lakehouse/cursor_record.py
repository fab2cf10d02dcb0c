"""The cursor of record: read from, and written into, the feed table itself.

This is the one place where a feed's cursors are read and written.

**Where it lives.** Every commit a load makes carries the *whole* `FeedState` (all partitions'
cursors, positions and drained flags) as the commit's `userMetadata`. Every row also carries its
page's cursor and its position, so the rows themselves hold each partition's resume point.

A load whose rows are written by the same Spark job that reads them (`commit.py`) cannot know where
its partitions stop before Delta commits the rows: that commit (the **rows commit**) carries the
state the load started from and names its partitions as `pending`. Each pending partition resumes
after its newest row in that commit (read from the commit's own data files, `DeltaLog.added_files`:
milliseconds) or, with no row past its start, from its start. Where that is where the read ended
(the usual case: the read stopped after a page of events), the rows commit is the load's only commit.
Where the rows cannot say it (the read moved the cursor past its last row over pages without events,
or drained a closed partition), the load then commits the state those rows end at (the **state
commit**, no rows), from what Spark reports of the committed task attempts. A load killed between
the two commits loses nothing and repeats nothing: the pages after the last row hold no event.

**How it is read** (`read_committed_state`), newest first through the Delta log:

1. the newest commit that carries a state (a rows commit's pending partitions taken from its rows),
   skipping the commits a `RESTORE` undid (a RESTORE to
   version N makes the state of N the state again: the next load re-reads what the restore took out);
   commits without state (OPTIMIZE, VACUUM, a user's DELETE or SET TBLPROPERTIES) leave it as it is;
2. when no commit in the log carries one because the log was cleaned up (a checkpoint keeps no
   `commitInfo`), the state is **recovered from the rows**: each partition resumes after its newest
   row's page, at position max + 1. That cursor is exact for the events: the pages after it held no
   stored event (filtered, empty, or duplicates of stored ones) and read again they give none. Drained
   flags are found again by reading closed partitions to their end. The next commit carries the state
   again (a load re-asserts a state recovered, or one that others' commits have pushed far back);
3. no commit carries one and the log still reaches back to version 0: a new table (or one a RESTORE
   took back to before its first load); no state, no rows and a cleaned log: `StateError` (never a
   silent restart from `_first`).

**Concurrent writers** are serialised through Delta's application transaction: a commit declares
`txnVersion` = the table version its state was read at + 1. Table versions only grow (through
RESTOREs and others' commits too) and a recorded `txnVersion` is never above the version it was
committed at, so a load's commit is refused only when another load committed after its read: of two
loads that read the same version only one commits, and the other re-reads the state and rebases
(`DeltaSink`). `txn` entries are kept by checkpoints, the state they guard is found as above.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from feedapi_dagster.errors import StateError
from feedapi_dagster.lakehouse.delta_log import FILE_MAINTENANCE, DeltaLog, HistoryEntry
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.planning import FeedState, PartitionState
from feedapi_dagster.read.rows import PARTITION_COLUMN

if TYPE_CHECKING:
    import pyarrow as pa

METADATA_KEY = "feedapi_dagster"
# Commits made by others (OPTIMIZE, manual writes) carry no state; look this far back first.
RECENT_HISTORY = 50
# A load re-asserts the state (an empty commit carrying it) once this many commits of others lie
# between it and the table's head: Delta's log cleanup removes old commits only behind a checkpoint
# (every 10 commits by default), so the state stays in the log while the feed's loads run.
REASSERT_AFTER_COMMITS = 5

Source = Literal["commit", "rows", "new"]
# the operation metric of a Delta write (in its commit's `operationMetrics`) counting the rows it added
_ROWS_WRITTEN = "numOutputRows"


class RecoveryNeedsSpark(StateError):
    """The state must be recovered from the rows, and the table was given as a path, not a `FeedTable`."""


@dataclass(frozen=True)
class CommittedState:
    state: FeedState
    source: Source  # a commit carrying it, recovered from the rows, or a new table's empty state
    load_id: str | None  # the load that wrote it
    delta_version: int | None  # the Delta table version holding it (None: not from a commit)
    # the newest version with the same rows: the state's own, or the last of the OPTIMIZE and VACUUM
    # commits right after it. Loads read the stored rows at this version: a VACUUM may have deleted
    # the files of `delta_version` that OPTIMIZE rewrote.
    rows_version: int | None
    table_version: int | None  # the version it was read at: a commit on it uses txnVersion + 1
    # a rows commit's partitions whose end is in its rows, not in a state commit: `resolve` reads them
    # from the rows; always () on a resolved state, whose `ends_from_rows` they are
    pending: tuple[int, ...] = ()
    ends_from_rows: tuple[int, ...] = ()

    @property
    def txn_version(self) -> int:
        return (self.table_version or 0) + 1

    @property
    def due_for_reassertion(self) -> bool:
        """Whether the next load should commit the state again even with nothing new to add: a state
        recovered from the whole table's rows (no commit carries it), or one whose commit others' commits
        pushed far back. A rows commit's state is carried by that commit as any other's (the ends of its
        partitions by its rows, which outlive the log)."""
        if self.source == "rows":
            return True
        return (
            self.source == "commit"
            and self.table_version is not None
            and self.table_version - (self.delta_version or 0) >= REASSERT_AFTER_COMMITS
        )

    def describe(self) -> str:
        if self.source == "commit":
            in_rows = f", the ends of partitions {list(self.ends_from_rows)} in its rows" if self.ends_from_rows else ""
            return f"commit {self.delta_version} (load {self.load_id}){in_rows}, read at version {self.table_version}"
        if self.source == "rows":
            return f"recovered from the rows at version {self.table_version} (no commit in the log carries it)"
        return "a new table: no state yet"


@dataclass(frozen=True)
class History:
    states: list[CommittedState]  # carried by commits, newest first, without those a RESTORE undid
    table_version: int | None
    complete: bool  # the log reaches back to version 0: nothing was cleaned up


def encode(
    state: FeedState, load_id: str, run_id: str | None, pending: tuple[int, ...] = (), replaced: tuple[int, ...] = ()
) -> str:
    """`pending`: a rows commit's partitions, whose ends its rows hold (`state` has their starts);
    `replaced`: the partitions whose rows the commit replaced (a rebuild), which the count of users'
    DELETEs (`deletes.py`) cannot tell from the files of a clustered table."""
    body = {"load_id": load_id, "run_id": run_id, **state.model_dump(mode="json")}
    if pending:
        body["pending"] = sorted(pending)
    if replaced:
        body["replaced"] = sorted(replaced)
    return json.dumps({METADATA_KEY: body}, separators=(",", ":"))


def replaced_partitions(user_metadata: str | None) -> tuple[int, ...] | None:
    """The partitions a load's commit says it replaced (`encode`); None when it does not say (a commit
    of an older release, or not a load's)."""
    try:
        body = json.loads(user_metadata or "")[METADATA_KEY]
        replaced = body.get("replaced")
        return None if replaced is None else tuple(int(p) for p in replaced)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def commits_of_run_after(table: FeedTable | DeltaLog, run_id: str, after: float, limit: int = RECENT_HISTORY) -> int:
    """How many of the table's newest `limit` commits the run `run_id` made later than `after` (a Unix
    time): what a stream's query committed after its run was gone."""
    count = 0
    for entry in table.history(limit):
        if entry.timestamp is not None and entry.timestamp <= after:
            break  # newest first
        try:
            body = json.loads(entry.user_metadata or "")[METADATA_KEY]
        except (ValueError, TypeError, KeyError):
            continue
        count += isinstance(body, dict) and body.get("run_id") == run_id
    return count


def decode(user_metadata: str | None, version: int) -> tuple[FeedState, str, tuple[int, ...]] | None:
    """The state a commit's user metadata carries; None when it carries none (others' commits)."""
    if not user_metadata:
        return None
    try:
        document = json.loads(user_metadata)
    except ValueError:
        return None
    body = document.get(METADATA_KEY) if isinstance(document, dict) else None
    if body is None:
        return None
    try:
        pending = tuple(int(p) for p in body.get("pending", ()))
        return FeedState.model_validate(body), body.get("load_id"), pending
    except (ValidationError, AttributeError, TypeError, ValueError) as error:
        raise StateError(
            f"the feed state in Delta commit {version} cannot be read ({error}); it was written "
            "by another program or edited. Restore the table to a version before it, or remove "
            f"the commit's `{METADATA_KEY}` user metadata"
        ) from None


def committed_states(entries: list[HistoryEntry], table_version: int | None) -> list[CommittedState]:
    """The states among history entries (newest first), newest first. Commits without state are
    skipped (OPTIMIZE, VACUUM, manual writes), and so are the commits a RESTORE undid."""
    states = []
    maintained: int | None = None  # the newest version while only file maintenance is seen
    unchanged = True  # no commit but file maintenance seen yet: the rows are those of the next state
    undone_above: int | None = None  # a RESTORE to this version undid the commits after it
    for entry in entries:
        if undone_above is not None and entry.version > undone_above:
            continue
        decoded = decode(entry.user_metadata, entry.version)
        if decoded is not None:
            rows_version = maintained if unchanged and maintained is not None else entry.version
            # a rows commit that added no row leaves its partitions where they started: nothing to read
            pending = decoded[2] if entry.metrics.get(_ROWS_WRITTEN) != "0" else ()
            states.append(
                CommittedState(decoded[0], "commit", decoded[1], entry.version, rows_version, table_version, pending)
            )
            unchanged = False
        elif entry.restored_version is not None:
            undone_above = entry.restored_version
            # the rows are those of the restored version: like maintenance, the state found next has them
            maintained = entry.version if maintained is None else maintained
        elif unchanged and entry.operation in FILE_MAINTENANCE:
            maintained = entry.version if maintained is None else maintained
        else:
            unchanged = False
    return states


def read_history(table: FeedTable | DeltaLog | str, limit: int | None = RECENT_HISTORY) -> History:
    """The states committed to the table (`table`, or a log or local path read with delta-rs)."""
    log = DeltaLog(table) if isinstance(table, str) else table
    entries = log.history(limit)
    table_version = entries[0].version if entries else None
    states = committed_states(entries, table_version)
    truncated = limit is not None and limit > 0 and len(entries) >= limit
    if not states and truncated:
        return read_history(log, None)
    complete = not truncated and (not entries or entries[-1].version == 0)
    return History(states, table_version, complete)


def resolve(table: FeedTable | DeltaLog | str, history: History) -> CommittedState:
    """The cursor of record, from the history read (see the module docstring)."""
    path = table if isinstance(table, str) else table.path
    spark_table = table if isinstance(table, FeedTable) else None
    if history.states and history.states[0].pending:
        log = table.delta_log if isinstance(table, FeedTable) else DeltaLog(table) if isinstance(table, str) else table
        return _with_pending_rows(history.states[0], spark_table, log, path)
    if history.states:
        return history.states[0]
    if history.complete:  # every commit is in the log, and no load's commit is in effect
        return CommittedState(FeedState(), "new", None, None, None, history.table_version)
    if spark_table is None:
        raise RecoveryNeedsSpark(
            f"no commit in the Delta log of {path} carries the feed state: it must be recovered "
            "from the table's rows, which takes Spark (`feedapi-dagster state` does it)"
        )
    last_rows = spark_table.last_rows(history.table_version)
    if last_rows:
        state = FeedState(
            partitions={
                pid: PartitionState(cursor=cursor, position=position + 1)
                for pid, (position, cursor) in last_rows.items()
            }
        )
        return CommittedState(state, "rows", None, None, history.table_version, history.table_version)
    raise StateError(
        f"the Delta table {path} has no rows and its log no longer reaches back to its creation (cleaned up "
        "by Delta), and no commit left in it carries the feed state: whether its events were deleted or "
        "never loaded cannot be told, so nothing is loaded. To load the feed from the start into it, "
        "remove the table (its folder); to keep it empty, leave the feed's schedule off"
    )


def _with_pending_rows(
    rows_commit: CommittedState, table: FeedTable | None, log: DeltaLog | None, path: str
) -> CommittedState:
    """A rows commit's state: each pending partition after its newest row, or at its start when the
    commit added none past it (the pages it read held no new event: read again, they give none).

    Its newest rows are those of the commit's own files, read by delta-rs (`log`: milliseconds); where
    an OPTIMIZE rewrote those, the partitions' rows at `rows_version` (the same rows), by delta-rs, or by
    Spark where delta-rs cannot (storage only the cluster reaches, a reader feature delta-rs lacks). The
    newest rows of a partition are its newest rows of the commit: its rows before lie before its start."""
    assert rows_commit.delta_version is not None and rows_commit.rows_version is not None  # a commit's
    rows_version = rows_commit.rows_version
    key = (path, rows_commit.delta_version, rows_commit.load_id)
    last_rows = _RESOLVED.get(key)
    if last_rows is None and log is not None:
        added = log.added_files(rows_commit.delta_version)
        rows = _read_rows(log, lambda: log.snapshot(), paths=added) if added is not None else None
        if rows is None:  # its files rewritten since (OPTIMIZE): the same rows, those of its partitions then
            rows = _read_rows(log, lambda: log.snapshot_at(rows_version), wanted=set(rows_commit.pending))
        last_rows = _newest_rows(rows) if rows is not None else None
    if last_rows is None and table is None:
        raise RecoveryNeedsSpark(
            f"the newest feed state in the Delta log of {path} is a load's rows commit: its partitions' ends "
            "are read from the table's rows, which delta-rs cannot read here and Spark can "
            "(`feedapi-dagster state` does it)"
        )
    if last_rows is None:
        assert table is not None  # raised above otherwise
        last_rows = table.last_rows(rows_commit.rows_version, rows_commit.pending)
    _RESOLVED[key] = last_rows
    while len(_RESOLVED) > _RESOLVED_KEPT:
        del _RESOLVED[next(iter(_RESOLVED))]
    state = rows_commit.state
    updates = {}
    for pid in rows_commit.pending:
        start = state.get(pid) or PartitionState()
        if pid in last_rows and last_rows[pid][0] >= start.position:
            position, cursor = last_rows[pid]
            updates[pid] = PartitionState(cursor=cursor, position=position + 1, inherited_from=start.inherited_from)
    resolved = FeedState(generation=state.generation, partitions={**state.partitions, **updates})
    return CommittedState(
        resolved,
        "commit",
        rows_commit.load_id,
        rows_commit.delta_version,
        rows_commit.rows_version,
        rows_commit.table_version,
        ends_from_rows=rows_commit.pending,
    )


# a row's columns that say where its partition resumes after it
_NEWEST_ROW_COLUMNS = (PARTITION_COLUMN, "position", "cursor")
# The newest rows of the rows commits resolved in this process (a load reads its own commit's again,
# to plan its next wave and for its materializations; a sensor at each tick), by table, version and
# the commit's load id (a table removed and made again reuses versions): a commit's rows never change.
_RESOLVED: dict[tuple[str, int, str | None], dict[int, tuple[int, str]]] = {}
_RESOLVED_KEPT = 64


def _read_rows(
    log: DeltaLog, snapshot: Callable[[], Any], *, paths: set[str] | None = None, wanted: set[int] | None = None
) -> pa.Table | None:
    """`_NEWEST_ROW_COLUMNS` of the rows of the data files `paths` or of the partitions `wanted`, in
    `snapshot()`, read by delta-rs (`DeltaLog.partition_columns`); None where it cannot read them."""
    try:
        rows = log.partition_columns(snapshot(), paths=paths, wanted=wanted, columns=_NEWEST_ROW_COLUMNS)
    except Exception:  # noqa: BLE001 - delta-rs (a reader feature it lacks) and the storage raise many types
        return None
    return None if rows.column("position").null_count else rows


def _newest_rows(rows: pa.Table) -> dict[int, tuple[int, str]]:
    """Each partition's newest row among `rows` (`_NEWEST_ROW_COLUMNS`): its position and its page's cursor.
    The highest positions first, then their rows by a hash join (a sort of millions of rows costs ten
    times as much: `benchmarks/README.md`)."""
    import pyarrow as pa

    maxima = rows.select([PARTITION_COLUMN, "position"]).group_by(PARTITION_COLUMN).aggregate([("position", "max")])
    highest = pa.table({PARTITION_COLUMN: maxima[PARTITION_COLUMN], "position": maxima["position_max"]})
    newest = rows.join(highest, keys=[PARTITION_COLUMN, "position"], join_type="inner").to_pydict()
    return {
        int(pid): (position, cursor)
        for pid, position, cursor in zip(newest[PARTITION_COLUMN], newest["position"], newest["cursor"], strict=True)
    }


def read_committed_state(table: FeedTable | DeltaLog | str) -> CommittedState:
    """The table's cursor of record (an empty state for a new table)."""
    return resolve(table, read_history(table))
