"""`DeltaSink`: rows and the feed's state in idempotent Delta commits, made by Spark: one commit of
rows and the state they end at (a kept read), or a streamed read's rows commit (the state it started
from, its partitions pending) followed by its state commit (`cursor_record.py`)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from feedapi_dagster.errors import CommitExhausted, PartitionConflict
from feedapi_dagster.lakehouse import cursor_record as committed
from feedapi_dagster.lakehouse.feed_table import Commit, FeedTable, Written
from feedapi_dagster.planning import FeedState, PartitionState
from feedapi_dagster.read.rows import EVENT_SCHEMA, spark_ddl
from feedapi_dagster.spark.failures import is_commit_conflict

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


def partition_conflict(
    partition_id: int, expected: PartitionState | None, found: PartitionState | None
) -> PartitionConflict:
    return PartitionConflict(
        f"partition {partition_id}: another load committed first (expected cursor "
        f"{expected.cursor if expected else None!r}, found {found.cursor if found else None!r}); "
        "nothing of this load was committed for it",
        partition_id=partition_id,
    )


# commits looked at first for a commit of this sink's own (Spark writes, or a write that raised)
_JUST_COMMITTED = 4


class DeltaSink:
    """Writes a feed's `FeedTable`. One sink per load process; it caches the last committed state, so
    that each commit costs one Spark write and one short history read (to see that Delta did not skip
    the write)."""

    def __init__(
        self,
        table: FeedTable,
        *,
        run_id: str | None = None,
        max_conflict_retries: int = 8,
    ):
        self.table = table
        self.path = table.path
        self.run_id = run_id
        self.max_conflict_retries = max_conflict_retries
        self._committed: committed.CommittedState | None = None
        # what the write job of the rows the last `commit` landed counted of them (a variant table's
        # unparsed payloads, a columns table's added columns); None also where it landed though its write raised (no count came back)
        self.landed_written: Written | None = None
        self.table.ensure_table()

    # ------------------------------------------------------------------ reading
    def committed_state(self, refresh: bool = False) -> committed.CommittedState:
        if refresh or self._committed is None:
            self._read_history()
        assert self._committed is not None  # `_read_history` sets it
        return self._committed

    @property
    def state(self) -> FeedState:
        return self.committed_state().state

    # ------------------------------------------------------------------ writing
    def commit(
        self,
        rows: Callable[[], DataFrame],
        updates: Mapping[int, PartitionState],
        expected: Mapping[int, PartitionState | None],
        *,
        replace: Iterable[int] = (),
        pending: Iterable[int] = (),
    ) -> committed.CommittedState:
        """Append the rows `rows()` gives (`rows.EVENT_SCHEMA`; or, for `replace` partitions, replace
        their rows) and advance the state by `updates`, in one Delta commit: the state it carries, at
        its version (rebased on others' commits: not always the state this load read first).

        `rows` is called once per attempt: a streamed read (`FeedRead`) is read again by each Spark job.
        `pending`: partitions whose `updates` are where the load started and whose ends are in the rows
        (a rows commit; `commit_state` follows). `expected` is each updated partition's committed state
        this load continues from; when another writer changed it meanwhile, `PartitionConflict` is
        raised and nothing is committed. A commit that lost a race with a writer of other partitions is
        rebased and retried; `CommitExhausted` when it lost every one of `max_conflict_retries`.
        """
        replace = tuple(sorted(set(replace)))
        pending = tuple(sorted(set(pending)))
        commit_id = uuid.uuid4().hex
        self.landed_written = None
        for attempt in range(1, self.max_conflict_retries + 1):
            base = self.committed_state(refresh=attempt > 1)  # a rebase reads what came first
            for partition_id, want in expected.items():
                found = base.state.get(partition_id)
                if found != want:
                    raise partition_conflict(partition_id, want, found)
            new_state = base.state.advanced(dict(updates))
            metadata = committed.encode(new_state, commit_id, self.run_id, pending, replace)
            commit = Commit(rows(), metadata, base.txn_version, replace, partitions=len(updates))
            try:
                written = self.table.write(commit, self.run_id)
            except Exception as error:  # noqa: BLE001 - classified below; Spark raises many types
                if (version := self._landed(commit_id)) is not None:
                    return self._after(
                        committed.CommittedState(new_state, "commit", commit_id, version, version, version, pending)
                    )
                if not is_commit_conflict(error):
                    raise
                log.info("commit to %s lost a race (attempt %d); rebasing", self.path, attempt)
                continue
            if (version := self._landed(commit_id)) is not None:
                self.landed_written = written
                return self._after(
                    committed.CommittedState(new_state, "commit", commit_id, version, version, version, pending)
                )
            # Delta skipped the write: another load committed after this one read the table
            log.info("commit to %s was superseded by another load's (attempt %d); rebasing", self.path, attempt)
        raise CommitExhausted(
            f"could not commit to {self.path} after {self.max_conflict_retries} attempts: "
            "other loads of this feed committed first every time"
        )

    def _after(self, landed: committed.CommittedState) -> committed.CommittedState:
        """The state to base the next commit on: this commit's own (a rows commit's is read again, once
        its state commit follows)."""
        self._committed = None if landed.pending else landed
        return landed

    def commit_state(self, rows_commit: int, state: FeedState) -> int | None:
        """Commit `state` (no rows) right after this sink's rows commit at version `rows_commit`: its
        state with the ends its rows hold, and what rows cannot say (cursors past the last row, drained).
        Its version, or None when another load committed after the rows commit first (its state was
        taken from those rows: nothing is lost, the cursors past the last rows are read again)."""
        commit_id = uuid.uuid4().hex
        metadata = committed.encode(state, commit_id, self.run_id)
        empty = self.table.spark.createDataFrame([], spark_ddl(EVENT_SCHEMA))
        try:
            self.table.write(Commit(empty, metadata, rows_commit + 1), self.run_id)
        except Exception as error:  # noqa: BLE001 - classified below; Spark raises many types
            if not is_commit_conflict(error) and self._landed(commit_id) is None:
                raise
        version = self._landed(commit_id)
        if version is None:
            log.info(
                "the state commit after rows commit %s of %s was superseded by another load's", rows_commit, self.path
            )
        self._committed = None  # read again on use: the newest state, resolved
        return version

    def _read_history(self, limit: int = committed.RECENT_HISTORY) -> list[committed.CommittedState]:
        history = committed.read_history(self.table, limit)
        self._committed = committed.resolve(self.table, history)
        if self._committed.source == "rows" and self._committed.delta_version is None:
            log.warning(
                "no commit in the Delta log of %s carries the feed state any more (Delta's log cleanup): "
                "the cursors were recovered from the table's rows; the next commit carries them again",
                self.path,
            )
        return history.states

    def _landed(self, commit_id: str) -> int | None:
        """The version of the commit when it is in the table (Delta Spark silently skips a txnVersion
        already used); the state it leaves is read again on use.

        Right after a commit it is nearly always the newest one: the last few commits are looked at
        first, the usual depth only when it is not among them."""
        for limit in (_JUST_COMMITTED, committed.RECENT_HISTORY):
            history = committed.read_history(self.table, limit)
            for entry in history.states:
                if entry.load_id == commit_id:
                    return entry.delta_version
        return None
