"""The cursor of record: read from, and written into, the feed table's own Delta commits.

This is the one place where a feed's cursors are read and written.

Every commit the sink makes carries the *whole* `FeedState` (all partitions' cursors, positions and
drained flags) as the commit's `userMetadata`, next to the rows it adds, so rows and cursors land in
one atomic Delta commit: a process killed before the commit loses nothing, one killed after it
resumes from exactly what the commit covered.

Concurrent writers are serialised through Delta's application transaction (`txnAppId`/`txnVersion`):
a commit declares `txnVersion = state.generation`, so of two writers that read the same generation
only one commits; the other is skipped by Delta Spark, re-reads the state and rebases (see `DeltaSink`).

The rows come from a read that Spark staged once (`loader`), and the cursors committed are those
that the staged read's checkpoint rows give: the cursors of the very rows committed, whatever task
attempts Spark ran.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from feedapi_dagster.planning import FeedState

from .delta import FILE_MAINTENANCE, DeltaLog, HistoryEntry

if TYPE_CHECKING:
    from .delta import FeedTable

METADATA_KEY = "feedapi_dagster"
# Commits made by others (OPTIMIZE, manual writes) carry no state; look this far back first.
RECENT_HISTORY = 50


@dataclass(frozen=True)
class CommittedState:
    state: FeedState
    load_id: str | None  # the load that wrote it
    delta_version: int | None  # the Delta table version holding it
    # the newest version with the same rows: the state's own, or the last of the OPTIMIZE and VACUUM
    # commits right after it. Loads read the stored rows at this version: a VACUUM may have deleted
    # the files of `delta_version` that OPTIMIZE rewrote.
    rows_version: int | None


def encode(state: FeedState, load_id: str, run_id: str | None) -> str:
    document = {METADATA_KEY: {"load_id": load_id, "run_id": run_id, **state.model_dump(mode="json")}}
    return json.dumps(document, separators=(",", ":"))


def decode(user_metadata: str | None) -> tuple[FeedState, str] | None:
    if not user_metadata:
        return None
    try:
        document = json.loads(user_metadata)
    except ValueError:
        return None
    body = document.get(METADATA_KEY) if isinstance(document, dict) else None
    if not isinstance(body, dict):
        return None
    return FeedState.model_validate(body), body.get("load_id")


def committed_states(entries: list[HistoryEntry]) -> list[CommittedState]:
    """The states among history entries (newest first), newest first. Commits without state are
    skipped (OPTIMIZE, VACUUM, manual writes)."""
    states = []
    maintained: int | None = None  # the newest version while only file maintenance is seen
    unchanged = True  # no commit but file maintenance seen yet: the rows are those of the next state
    for entry in entries:
        decoded = decode(entry.user_metadata)
        if decoded is not None:
            rows_version = maintained if unchanged and maintained is not None else entry.version
            states.append(CommittedState(decoded[0], decoded[1], entry.version, rows_version))
            unchanged = False
        elif unchanged and entry.operation in FILE_MAINTENANCE:
            maintained = entry.version if maintained is None else maintained
        else:
            unchanged = False
    return states


def read_history(table: "FeedTable | str", limit: int | None = RECENT_HISTORY,
                 refresh: Any = None) -> tuple[Any, list[CommittedState]]:
    """A snapshot of the table (`table`, or a path read with delta-rs) and the states
    committed to it, newest first. `refresh`: a snapshot read before, brought up to date in place."""
    log = DeltaLog(table) if isinstance(table, str) else table
    snapshot, entries = log.history(limit, refresh)
    states = committed_states(entries)
    if not states and limit and len(entries) >= limit:
        return read_history(log, None, snapshot)
    return snapshot, states


def read_committed_state(table: "FeedTable | str") -> CommittedState:
    """The newest state committed to the table (an empty state for a new table)."""
    states = read_history(table)[1]
    return states[0] if states else CommittedState(FeedState(), None, None, None)
