"""What a consumer remembers of each partition: the cursor of record and what it covered.

The lakehouse stores a `FeedState` in every Delta commit it makes (see `lakehouse/cursor_record.py`);
this module only defines it, so that planning stays pure.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from feedapi_dagster.protocol.models import FIRST


class PartitionState(BaseModel):
    """The committed progress of one partition."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    cursor: str = FIRST
    # Rows this partition holds in the table: the next event's 0-based position.
    position: int = Field(default=0, ge=0)
    # Closed (or finished by a `_done` checkpoint) and read to its end: nothing more will come.
    drained: bool = False
    # Where the partition started, when it inherited an ancestor's cursor (method-2 split).
    inherited_from: int | None = None


class FeedState(BaseModel):
    """The progress of every partition a table has seen, vanished ones included."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    # Incremented by every commit that carries state (a count; writers are serialised by table versions).
    generation: int = Field(default=0, ge=0)
    partitions: dict[int, PartitionState] = Field(default_factory=dict)

    def get(self, partition_id: int) -> PartitionState | None:
        return self.partitions.get(partition_id)

    def advanced(self, updates: dict[int, PartitionState]) -> FeedState:
        return FeedState(generation=self.generation + 1, partitions={**self.partitions, **updates})
