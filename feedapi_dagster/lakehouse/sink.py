"""`DeltaSink`: rows and the feed's cursors in one idempotent Delta commit, made by Spark."""
from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from feedapi_dagster.planning import FeedState, PartitionState

from . import state as committed
from .delta import Commit, FeedTable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


class PartitionConflict(RuntimeError):
    """Another load committed progress for a partition this load was writing: this load's rows for it
    are discarded (they are the other load's too) and the load stops."""

    def __init__(self, partition_id: int, expected: PartitionState | None, found: PartitionState | None):
        super().__init__(
            f"partition {partition_id}: another load committed first (expected cursor "
            f"{expected.cursor if expected else None!r}, found {found.cursor if found else None!r}); "
            "nothing of this load was committed for it"
        )
        self.partition_id = partition_id


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
        self._snapshot = None  # the table snapshot `_committed` was read from: commits are based on it
        self.table.ensure_table()

    # ------------------------------------------------------------------ reading
    def committed_state(self, refresh: bool = False) -> committed.CommittedState:
        if refresh or self._committed is None:
            self._read_history()
        return self._committed

    @property
    def state(self) -> FeedState:
        return self.committed_state().state

    # ------------------------------------------------------------------ writing
    def commit(
        self,
        rows: "DataFrame",
        updates: Mapping[int, PartitionState],
        expected: Mapping[int, PartitionState | None],
        *,
        replace: Iterable[int] = (),
    ) -> committed.CommittedState:
        """Append `rows` (`table.EVENT_SCHEMA`; or, for `replace` partitions, replace their rows) and
        advance the state by `updates`, in one Delta commit.

        `expected` is each updated partition's committed state this load continues from; when another
        writer changed it meanwhile, `PartitionConflict` is raised and nothing is committed. A commit
        that lost a race with a writer of other partitions is rebased and retried.
        """
        replace = tuple(sorted(set(replace)))
        commit_id = uuid.uuid4().hex
        for attempt in range(1, self.max_conflict_retries + 1):
            base = self.committed_state()
            for partition_id, want in expected.items():
                found = base.state.get(partition_id)
                if found != want:
                    raise PartitionConflict(partition_id, want, found)
            new_state = base.state.advanced(dict(updates))
            commit = Commit(rows, committed.encode(new_state, commit_id, self.run_id), base.txn_version, replace)
            try:
                self.table.write(commit, self.run_id)
            except Exception as error:  # noqa: BLE001 - classified below; Spark raises many types
                if self._landed(commit_id):
                    break
                if not self.table.is_conflict(error):
                    raise
                log.info("commit to %s lost a race (attempt %d); rebasing", self.path, attempt)
                continue
            if self._landed(commit_id):
                break
            # Delta skipped the write: another load committed after this one read the table
            log.info("commit to %s was superseded by another load's (attempt %d); rebasing", self.path, attempt)
        else:
            raise RuntimeError(f"could not commit to {self.path} after {self.max_conflict_retries} attempts: "
                               "other loads of this feed committed first every time")
        return self.committed_state()

    def _read_history(self, limit: int = committed.RECENT_HISTORY) -> list[committed.CommittedState]:
        # The snapshot is this sink's own (nothing else refreshes it), and the state is read with it.
        self._snapshot, history = committed.read_history(self.table, limit, refresh=self._snapshot)
        self._committed = committed.resolve(self.table, history)
        if self._committed.source == "rows":
            log.warning("no commit in the Delta log of %s carries the feed state any more (Delta's log cleanup): "
                        "the cursors were recovered from the table's rows; the next commit carries them again",
                        self.path)
        return history.states

    def _landed(self, commit_id: str) -> bool:
        """Whether the commit is in the table (Delta Spark silently skips a txnVersion already used).

        Right after a commit it is nearly always the newest one: the last few commits are looked at
        first, the usual depth only when it is not among them."""
        if any(entry.load_id == commit_id for entry in self._read_history(_JUST_COMMITTED)):
            return True
        return any(entry.load_id == commit_id for entry in self._read_history())
