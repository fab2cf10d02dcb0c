"""`DeltaSink`: rows and the feed's cursors in one idempotent Delta commit."""
from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from feedapi_dagster.planning import FeedState, PartitionState

from . import state as committed
from .table import check_id_field, ensure_table, rows_frame

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

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


class DeltaSink:
    """Writes a feed's table at `path`. One sink per load process; it caches the last committed state
    so that each commit costs one Delta write plus one short history read."""

    def __init__(
        self,
        spark: "SparkSession",
        path: str,
        *,
        event_id_field: str = "id",
        run_id: str | None = None,
        compaction: CompactionSettings | None = None,
        max_conflict_retries: int = 8,
    ):
        self.spark = spark
        self.path = path
        self.event_id_field = check_id_field(event_id_field)
        self.run_id = run_id
        self.compaction = compaction or CompactionSettings()
        self.max_conflict_retries = max_conflict_retries
        self._committed: committed.CommittedState | None = None
        self._commits = 0
        ensure_table(spark, path)

    # ------------------------------------------------------------------ reading
    def committed_state(self, refresh: bool = False) -> committed.CommittedState:
        if refresh or self._committed is None:
            self._committed = committed.read_committed_state(self.spark, self.path)
        return self._committed

    @property
    def state(self) -> FeedState:
        return self.committed_state().state

    def event_ids(self, partition_ids: Iterable[int]) -> dict[int, set[str]]:
        """Event ids already stored per partition (deduplication of at-least-once feeds), one query."""
        ids = ",".join(str(int(p)) for p in sorted(set(partition_ids)))
        stored: dict[int, set[str]] = {}
        if not ids:
            return stored
        rows = self.spark.sql(
            f"SELECT DISTINCT partition_id, event_id FROM delta.`{self.path}` "
            f"WHERE partition_id IN ({ids}) AND event_id IS NOT NULL").collect()
        for partition_id, event_id in rows:
            stored.setdefault(partition_id, set()).add(event_id)
        return stored

    def frame(self) -> "DataFrame":
        return self.spark.read.format("delta").load(self.path)

    # ------------------------------------------------------------------ writing
    def commit(
        self,
        rows: pa.Table,
        updates: Mapping[int, PartitionState],
        expected: Mapping[int, PartitionState | None],
        *,
        replace: Iterable[int] = (),
        staged: "DataFrame | None" = None,
    ) -> committed.CommittedState:
        """Append `rows` (or, for `replace` partitions, replace their rows) and advance the state by
        `updates`, in one Delta commit.

        `expected` is each updated partition's committed state this load continues from; when another
        writer changed it meanwhile, `PartitionConflict` is raised and nothing is committed. A commit
        that lost a race with a writer of other partitions is rebased and retried. `staged` rows (a
        rebuild's earlier batches) are written in the same commit.
        """
        replace = sorted(set(replace))
        commit_id = uuid.uuid4().hex
        frame = rows_frame(self.spark, rows, self.event_id_field, self.run_id)
        if staged is not None:
            frame = staged.unionByName(frame)
        for attempt in range(1, self.max_conflict_retries + 1):
            base = self.committed_state()
            for partition_id, want in expected.items():
                found = base.state.get(partition_id)
                if found != want:
                    raise PartitionConflict(partition_id, want, found)
            new_state = base.state.advanced(dict(updates))
            try:
                self._write(frame, new_state, commit_id, replace)
            except Exception as error:  # noqa: BLE001 - classified below; Spark/Connect raise many types
                if self._landed(commit_id):
                    break
                if not _is_concurrency_conflict(error):
                    raise
                log.info("commit to %s lost a race (attempt %d); rebasing", self.path, attempt)
                continue
            if self._landed(commit_id):
                break
            log.info("commit to %s was superseded (attempt %d); rebasing", self.path, attempt)
        else:
            raise RuntimeError(f"could not commit to {self.path} after {self.max_conflict_retries} attempts "
                               "(too many concurrent writers)")
        self._commits += 1
        return self.committed_state()

    def _write(self, frame: "DataFrame", state: FeedState, commit_id: str, replace: list[int]) -> None:
        writer = (frame.write.format("delta")
                  .option("txnAppId", committed.TXN_APP_ID)
                  .option("txnVersion", str(state.generation))
                  .option("userMetadata", committed.encode(state, commit_id, self.run_id)))
        if replace:
            writer = writer.mode("overwrite").option(
                "replaceWhere", f"partition_id IN ({','.join(map(str, replace))})")
        else:
            writer = writer.mode("append")
        writer.save(self.path)

    def _landed(self, commit_id: str) -> bool:
        """Whether the commit is in the table (Delta silently skips a txnVersion already used)."""
        history = committed.read_history(self.spark, self.path)
        self._committed = history[0] if history else committed.CommittedState(FeedState(), None, None)
        return any(entry.load_id == commit_id for entry in history)

    # ------------------------------------------------------------------ housekeeping
    def compact_if_due(self) -> bool:
        """OPTIMIZE when `every_commits` commits have piled up since the last one. Returns whether it ran."""
        if not self.compaction.enabled:
            return False
        every = self.compaction.every_commits
        operations = [row["operation"] for row in self.spark.sql(
            f"DESCRIBE HISTORY delta.`{self.path}` LIMIT {every}").select("version", "operation").collect()]
        if len(operations) < every or "OPTIMIZE" in operations:
            return False
        self.spark.sql(f"OPTIMIZE delta.`{self.path}`").collect()
        return True


def _is_concurrency_conflict(error: BaseException) -> bool:
    text = f"{type(error).__name__} {error}"
    return "DELTA_CONCURRENT" in text or "Concurrent" in text
