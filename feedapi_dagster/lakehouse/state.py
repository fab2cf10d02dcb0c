"""The cursor of record: read from, and written into, the feed table's own Delta commits.

This is the one place where a feed's cursors are read and written.

Every commit the sink makes carries the *whole* `FeedState` (all partitions' cursors, positions and
drained flags) as the commit's `userMetadata`, next to the rows it adds, so rows and cursors land in
one atomic Delta commit: a process killed before the commit loses nothing, one killed after it
resumes from exactly what the commit covered.

Concurrent writers are serialised through Delta's idempotent-write transaction id
(`txnAppId`/`txnVersion`): a commit declares `txnVersion = state.generation`, so of two writers that
read the same generation only one commits; the other is skipped or fails with a concurrent
transaction error, re-reads the state and rebases (see `DeltaSink`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from feedapi_dagster.planning import FeedState

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TXN_APP_ID = "feedapi-dagster"
METADATA_KEY = "feedapi_dagster"
# Commits made by others (OPTIMIZE, manual writes) carry no state; look this far back first.
RECENT_HISTORY = 50


@dataclass(frozen=True)
class CommittedState:
    state: FeedState
    load_id: str | None  # the load that wrote it
    delta_version: int | None  # the Delta table version holding it


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


def read_history(spark: "SparkSession", path: str, limit: int | None = RECENT_HISTORY) -> list[CommittedState]:
    """States committed to the table at `path`, newest first (commits without state are skipped)."""
    clause = f" LIMIT {limit}" if limit else ""
    rows = spark.sql(f"DESCRIBE HISTORY delta.`{path}`{clause}").select("version", "userMetadata").collect()
    states = []
    for row in sorted(rows, key=lambda r: r["version"], reverse=True):
        decoded = decode(row["userMetadata"])
        if decoded is not None:
            states.append(CommittedState(decoded[0], decoded[1], row["version"]))
    if not states and limit and len(rows) >= limit:
        return read_history(spark, path, None)
    return states


def read_committed_state(spark: "SparkSession", path: str) -> CommittedState:
    """The newest state committed to the table at `path` (an empty state for a new table)."""
    states = read_history(spark, path)
    return states[0] if states else CommittedState(FeedState(), None, None)
