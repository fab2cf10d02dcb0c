"""Where a stream stands: its offsets (`StreamOffset`: per partition a `PartitionOffset`, as JSON in
Spark's offset log), and for at-least-once feeds the ids of each partition's newest events they carry,
against which a micro-batch's repeats are dropped (`stream_source` says how a stream reads).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from feedapi_dagster.planning import FeedState, PartitionState
from feedapi_dagster.protocol.models import FIRST


@dataclass(frozen=True)
class PartitionOffset:
    cursor: str = FIRST
    position: int = 0
    drained: bool = False
    inherited_from: int | None = None
    recent_ids: tuple[str, ...] = ()  # the ids of its newest events (at-least-once feeds)

    def to_json(self) -> dict:
        fields: dict = {"cursor": self.cursor, "position": self.position, "drained": self.drained}
        if self.inherited_from is not None:
            fields["inheritedFrom"] = self.inherited_from
        if self.recent_ids:
            fields["recentIds"] = list(self.recent_ids)
        return fields

    @classmethod
    def from_json(cls, fields: dict) -> PartitionOffset:
        return cls(
            str(fields["cursor"]),
            int(fields["position"]),
            bool(fields.get("drained", False)),
            fields.get("inheritedFrom"),
            tuple(fields.get("recentIds", ())),
        )

    @classmethod
    def of_state(cls, state: PartitionState) -> PartitionOffset:
        """A partition's cursor of record as an offset (no recent ids: the table keeps none)."""
        return cls(state.cursor, state.position, state.drained, state.inherited_from)

    def state(self) -> PartitionState:
        return PartitionState(
            cursor=self.cursor, position=self.position, drained=self.drained, inherited_from=self.inherited_from
        )


@dataclass(frozen=True)
class StreamOffset:
    """Where each partition a stream has read stands; absent partitions have read nothing yet."""

    partitions: dict[int, PartitionOffset]

    def to_json(self) -> dict:
        return {"partitions": {str(pid): p.to_json() for pid, p in sorted(self.partitions.items())}}

    @classmethod
    def from_json(cls, fields: dict) -> StreamOffset:
        return cls({int(pid): PartitionOffset.from_json(p) for pid, p in fields.get("partitions", {}).items()})

    @classmethod
    def of_state(cls, state: FeedState) -> StreamOffset:
        """The offset of the partitions' cursors of record (where a query starts)."""
        return cls({pid: PartitionOffset.of_state(p) for pid, p in state.partitions.items()})

    def feed_state(self) -> FeedState:
        return FeedState(partitions={pid: p.state() for pid, p in self.partitions.items()})

    def start_of(self, partition_id: int, inherited_from: int | None) -> PartitionOffset:
        """Where a micro-batch starting here reads `partition_id` from (`inherited_from`: the method-2
        ancestor whose cursor a partition new to the stream takes)."""
        own = self.partitions.get(partition_id)
        if own is not None:
            return own
        ancestor = self.partitions.get(inherited_from) if inherited_from is not None else None
        if ancestor is None:
            return PartitionOffset()
        return PartitionOffset(ancestor.cursor, 0, False, inherited_from, ancestor.recent_ids)


def without_recent(batches: list[pa.RecordBatch], start: PartitionOffset) -> list[pa.RecordBatch]:
    """The rows whose id is not among the partition's newest ids of earlier micro-batches, positions
    renumbered from the start's."""
    if not start.recent_ids:
        return batches
    kept_batches = []
    position = start.position
    for batch in batches:
        kept = drop_recent(batch, start.recent_ids)
        kept_batches.append(renumbered(kept, position))
        position += kept.num_rows
    return kept_batches


def drop_recent(batch: pa.RecordBatch, ids: tuple[str, ...]) -> pa.RecordBatch:
    """The rows of `batch` whose id is not among `ids` (a partition's newest ids)."""
    if not ids or not batch.num_rows:
        return batch
    repeated = pc.fill_null(pc.is_in(batch.column("event_id"), pa.array(ids, pa.string())), False)
    return batch.filter(pc.invert(repeated))


def renumbered(batch: pa.RecordBatch, first: int) -> pa.RecordBatch:
    """`batch` with positions from `first` on."""
    index = batch.schema.get_field_index("position")
    positions = pa.array(range(first, first + batch.num_rows), pa.int64())
    return batch.set_column(index, "position", positions)


def newest_ids(previous: tuple[str, ...], batches: list[pa.RecordBatch], window: int) -> tuple[str, ...]:
    """The ids of the newest `window` events, `previous`'s and then `batches`'."""
    if window <= 0:
        return ()
    ids = [*previous]
    for batch in batches:
        ids.extend(i for i in batch.column("event_id").to_pylist() if i is not None)
    return tuple(ids[-window:])
