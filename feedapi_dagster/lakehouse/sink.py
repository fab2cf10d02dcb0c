"""`DeltaSink`: rows and the feed's cursors in one idempotent Delta commit."""
from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Iterable, Mapping
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from feedapi_dagster.planning import FeedState, PartitionState

from . import state as committed
from .engines import Commit, DeltaRsEngine, TableEngine
from .table import check_id_field, stamped

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


class CompactionSettings(BaseModel):
    """Housekeeping: many small commits make slow tables, so the sink runs Delta OPTIMIZE (bin-packing
    small files) once `every_commits` commits have accumulated since the last OPTIMIZE."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    every_commits: int = Field(default=50, ge=1)


# commits looked at first for a commit of this sink's own (Spark writes, or a write that raised)
_JUST_COMMITTED = 4


class DeltaSink:
    """Writes a feed's table through a `TableEngine` (delta-rs unless given another). One sink per
    load process; it caches the last committed state so that each commit costs one Delta write (plus,
    with the Spark engine, one short history read to see that the write was not skipped)."""

    def __init__(
        self,
        path: str,
        *,
        engine: TableEngine | None = None,
        event_id_field: str = "id",
        run_id: str | None = None,
        compaction: CompactionSettings | None = None,
        max_conflict_retries: int = 8,
    ):
        self.path = path
        self.engine = engine or DeltaRsEngine(path)
        self.event_id_field = check_id_field(event_id_field)
        self.run_id = run_id
        self.compaction = compaction or CompactionSettings()
        self.max_conflict_retries = max_conflict_retries
        self._committed: committed.CommittedState | None = None
        self._snapshot = None  # the table snapshot `_committed` was read from: commits are based on it
        self._commits = 0
        self.engine.ensure_table()

    # ------------------------------------------------------------------ reading
    def committed_state(self, refresh: bool = False) -> committed.CommittedState:
        if refresh or self._committed is None:
            self._read_history()
        return self._committed

    @property
    def state(self) -> FeedState:
        return self.committed_state().state

    def event_ids(self, partition_ids: Iterable[int]) -> dict[int, set[bytes]]:
        """Event ids already stored per partition, UTF-8 encoded as `table.event_ids` gives them
        (deduplication of at-least-once feeds), one query."""
        wanted = sorted(set(partition_ids))
        stored: dict[int, set[bytes]] = {}
        for partition_id, event_id in self.engine.event_ids(wanted) if wanted else []:
            stored.setdefault(partition_id, set()).add(event_id.encode())
        return stored

    # ------------------------------------------------------------------ writing
    def commit(
        self,
        rows: pa.Table,
        updates: Mapping[int, PartitionState],
        expected: Mapping[int, PartitionState | None],
        *,
        replace: Iterable[int] = (),
        staged: str | None = None,
    ) -> committed.CommittedState:
        """Append `rows` (`table.EVENT_SCHEMA`; or, for `replace` partitions, replace their rows) and
        advance the state by `updates`, in one Delta commit.

        `expected` is each updated partition's committed state this load continues from; when another
        writer changed it meanwhile, `PartitionConflict` is raised and nothing is committed. A commit
        that lost a race with a writer of other partitions is rebased and retried. The rows a rebuild
        `staged` earlier are written in the same commit.
        """
        replace = tuple(sorted(set(replace)))
        commit_id = uuid.uuid4().hex
        rows = stamped(rows, dt.datetime.now(dt.timezone.utc), self.run_id)
        for attempt in range(1, self.max_conflict_retries + 1):
            base = self.committed_state()
            for partition_id, want in expected.items():
                found = base.state.get(partition_id)
                if found != want:
                    raise PartitionConflict(partition_id, want, found)
            new_state = base.state.advanced(dict(updates))
            commit = Commit(rows, committed.encode(new_state, commit_id, self.run_id), new_state.generation,
                            replace, staged)
            try:
                landed = self.engine.write(commit, self._snapshot)
            except Exception as error:  # noqa: BLE001 - classified below; engines raise many types
                if self._landed(commit_id):
                    break
                if not self.engine.is_conflict(error):
                    raise
                log.info("commit to %s lost a race (attempt %d); rebasing", self.path, attempt)
                continue
            if landed is not None:
                # the engine proved it landed: the state is the one just written, nothing to read back
                # (a commit another writer makes after it is met by the next commit's conflict check)
                self._committed = committed.CommittedState(new_state, commit_id, landed)
                break
            if self._landed(commit_id):
                break
            log.info("commit to %s was superseded (attempt %d); rebasing", self.path, attempt)
        else:
            raise RuntimeError(f"could not commit to {self.path} after {self.max_conflict_retries} attempts "
                               "(too many concurrent writers)")
        self._commits += 1
        return self.committed_state()

    def stage(self, rows: pa.Table, staging: str) -> None:
        self.engine.stage(stamped(rows, dt.datetime.now(dt.timezone.utc), self.run_id), staging)

    def _read_history(self, limit: int = committed.RECENT_HISTORY) -> list[committed.CommittedState]:
        # The snapshot is this sink's own (nothing else refreshes it), and the state is read with it.
        self._snapshot, history = committed.read_history(self.engine, limit, refresh=self._snapshot)
        self._committed = history[0] if history else committed.CommittedState(FeedState(), None, None)
        return history

    def _landed(self, commit_id: str) -> bool:
        """Whether the commit is in the table (Delta Spark silently skips a txnVersion already used).

        Right after a commit it is nearly always the newest one: the last few commits are looked at
        first (delta-rs reads each commit file whole, holding the GIL the readers need: 50 of them
        were 10-20 % of a load's GIL time), the usual depth only when it is not among them."""
        if any(entry.load_id == commit_id for entry in self._read_history(_JUST_COMMITTED)):
            return True
        return any(entry.load_id == commit_id for entry in self._read_history())

    # ------------------------------------------------------------------ housekeeping
    def compact_if_due(self) -> bool:
        """OPTIMIZE when `every_commits` commits have piled up since the last one. Returns whether it ran."""
        if not self.compaction.enabled:
            return False
        every = self.compaction.every_commits
        # a snapshot of its own: the sink's commits stay based on the snapshot its state was read from
        operations = [entry.operation for entry in self.engine.history(every)[1]]
        if len(operations) < every or "OPTIMIZE" in operations:
            return False
        self.engine.compact()
        return True
