"""A seeded, in-memory Nakadi event type: partitions of business events with integer offsets, retention
and repartitioning. Event bytes are encoded once at publication; the server splices them into batches
as stored. The spec is `spec/nakadi-event-bus-api.yaml`.
"""

from __future__ import annotations

import json
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from feedapi_dagster.demo.nakadi.offsets import BEGIN, format_offset, parse_offset
from feedapi_dagster.demo.seeded import SeededFeed

# orders are drawn from a small pool so that an order has several events (in one partition, in order)
ORDER_POOL = 250
_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


# the JSON Schema of the events `_generate` writes, as their producer declares it; `metadata` is
# Nakadi's (a business event type's schema may not declare it)
ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "order_number": {"type": "string", "description": "the order the event is about"},
        "amount": {"type": "number", "minimum": 1, "description": "the order's amount"},
        "seq": {"type": "integer", "minimum": 1, "description": "the event's number, in publication order"},
    },
    "required": ["order_number", "amount", "seq"],
}


class UnknownPartitionError(LookupError):
    def __str__(self) -> str:
        return str(self.args[0])


class UnavailableOffsetError(ValueError):
    """A cursor before the retention window (or past the newest event)."""


@dataclass(slots=True)
class _Partition:
    first: int = 0  # offset of events[0]: the oldest available offset (the next offset when empty)
    events: list[bytes] = field(default_factory=list)  # the available events, in offset order
    eids: list[str] = field(default_factory=list)  # eid at every offset ever published, expired included

    @property
    def next(self) -> int:
        return self.first + len(self.events)


class NakadiEventType(SeededFeed):
    """A seeded, thread-safe, in-memory Nakadi event type of business events ("order" events)."""

    def __init__(
        self,
        name: str = "demo.orders",
        partitions: int = 4,
        events: int = 1000,
        seed: int = 0,
        duplicate_ratio: float = 0.0,
    ) -> None:
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        if not 0.0 <= duplicate_ratio <= 1.0:
            raise ValueError("duplicate_ratio must be in [0, 1]")
        super().__init__(seed, duplicate_ratio)
        self.name = name
        self._partitions = [_Partition() for _ in range(partitions)]
        self._all: dict[str, bytes] = {}  # eid -> bytes of every event ever published
        self._published = 0
        self.append(events)

    # ---- writing -------------------------------------------------------------------------------

    def append(self, count: int) -> None:
        """Publish `count` new events; with a duplicate ratio, some are published twice in a row."""
        if count < 0:
            raise ValueError("count must be >= 0")
        with self._lock:
            for _ in range(count):
                partition, eid, data = self._generate()
                self._publish(partition, eid, data)
                if self._republishes():
                    self._publish(partition, eid, data)  # at-least-once: the same event, the next offset
            self.changes.bump()

    def repartition(self, count: int) -> list[int]:
        """Raise the partition count to `count` (Nakadi cannot lower it); returns the new partition ids.

        New partitions start empty; later events hash over the new count, so an order's later events
        may land elsewhere than its earlier ones, as on a real repartitioned event type."""
        with self._lock:
            old = len(self._partitions)
            if count <= old:
                raise ValueError(f"partitions can only be raised: the event type has {old}, asked for {count}")
            self._partitions.extend(_Partition() for _ in range(count - old))
            self.changes.bump()
            return list(range(old, count))

    def expire(self, partition: int, keep_last: int) -> None:
        """Retention: drop all but the newest `keep_last` events of `partition`; offsets do not change."""
        if keep_last < 0:
            raise ValueError("keep_last must be >= 0")
        with self._lock:
            p = self._partition(partition)
            drop = max(0, len(p.events) - keep_last)
            del p.events[:drop]
            p.first += drop
            self.changes.bump()

    # ---- reading -------------------------------------------------------------------------------

    def definition(self) -> dict[str, object]:
        """The spec's `EventType`: a business event type, hashed by order, whose schema is `ORDER_SCHEMA`."""
        created = f"{_EPOCH:%Y-%m-%dT%H:%M:%SZ}"
        return {
            "name": self.name,
            "owning_application": "demo-shop",
            "category": "business",
            "enrichment_strategies": ["metadata_enrichment"],
            "partition_strategy": "hash",
            "partition_key_fields": ["order_number"],
            "compatibility_mode": "compatible",
            "cleanup_policy": "delete",
            "ordering_key_fields": ["seq"],
            "audience": "component-internal",
            "schema": {
                "type": "json_schema",
                "version": "1.0.0",
                "created_at": created,
                "schema": json.dumps(ORDER_SCHEMA),
            },
            "created_at": created,
            "updated_at": created,
        }

    def partition_count(self) -> int:
        with self._lock:
            return len(self._partitions)

    def partitions(self, cursors: Mapping[int, str] | None = None) -> list[dict[str, object]]:
        """The spec's `Partition` objects; those with a cursor (partition -> offset) get `unconsumed_events`."""
        cursors = dict(cursors or {})
        with self._lock:
            for partition in cursors:
                self._partition(partition)
            return [self.partition(p, cursors.get(p)) for p in range(len(self._partitions))]

    def partition(self, partition: int, consumed_offset: str | None = None) -> dict[str, object]:
        """One `Partition`. A partition that never had an event has newest_available_offset BEGIN; one whose
        events all expired keeps the offset of its last event as newest (as Kafka-backed Nakadi does)."""
        with self._lock:
            p = self._partition(partition)
            info: dict[str, object] = {
                "partition": str(partition),
                "oldest_available_offset": format_offset(p.first),
                "newest_available_offset": format_offset(p.next - 1) if p.next else BEGIN,
            }
            if consumed_offset is not None:
                # non-inclusive: a cursor at the newest event has 0 unconsumed events
                info["unconsumed_events"] = p.next - 1 - self.resolve(partition, consumed_offset)
            return info

    def resolve(self, partition: int, offset: str) -> int:
        """The last consumed offset a cursor stands for (BEGIN: just before the oldest available event).

        Raises UnknownPartitionError, ValueError (malformed) or UnavailableOffsetError (expired, or past
        the newest event)."""
        n = parse_offset(offset)
        with self._lock:
            p = self._partition(partition)
            if n is None:
                return p.first - 1
            if n < p.first - 1:
                raise UnavailableOffsetError(
                    f"offset {offset} for partition {partition} is unavailable: "
                    f"the oldest available offset is {format_offset(p.first)}"
                )
            if n >= p.next:
                newest = format_offset(p.next - 1) if p.next else BEGIN
                raise UnavailableOffsetError(
                    f"offset {offset} for partition {partition} is unavailable: the newest available offset is {newest}"
                )
            return n

    def read(self, partition: int, after_offset: str, limit: int) -> list[tuple[str, bytes]]:
        """Up to `limit` (offset, event bytes) after the exclusive `after_offset` (or BEGIN)."""
        after = self.resolve(partition, after_offset)
        return [(format_offset(after + 1 + i), data) for i, data in enumerate(self.read_raw(partition, after, limit))]

    def read_raw(self, partition: int, after: int, limit: int) -> list[bytes]:
        """Up to `limit` event bytes at offsets after+1, after+2, ... (the server's fast path).
        UnavailableOffsetError if offset after+1 has expired."""
        with self._lock:
            p = self._partition(partition)
            if after < p.first - 1:
                raise UnavailableOffsetError(
                    f"offset {format_offset(after)} for partition {partition} is unavailable: "
                    f"the oldest available offset is {format_offset(p.first)}"
                )
            start = after + 1 - p.first
            return p.events[start : start + limit]

    def expected_eids(self, partition: int | None = None) -> set[str]:
        """The eids published (to `partition`, or anywhere), expired ones included."""
        with self._lock:
            if partition is None:
                return set(self._all)
            return set(self._partition(partition).eids)

    def expected_events(self, partition: int, held: Sequence[str] = ()) -> list[str]:
        """What a consumer that drops repeated eids holds of `partition` once it read it from BEGIN,
        after the events `held` it held before: each available event's JSON once, in offset order."""
        with self._lock:
            p = self._partition(partition)
            seen = {json.loads(event)["metadata"]["eid"] for event in held}
            events = list(held)
            for eid, data in zip(p.eids[p.first :], p.events, strict=False):
                if eid not in seen:
                    seen.add(eid)
                    events.append(data.decode())
            return events

    def published_count(self) -> int:
        """Publications, duplicates and expired events included."""
        with self._lock:
            return self._published

    def unique_count(self) -> int:
        """Distinct events (eids) ever published."""
        with self._lock:
            return len(self._all)

    def all_events(self) -> dict[str, bytes]:
        """eid -> bytes of every event ever published, expired included."""
        with self._lock:
            return dict(self._all)

    # ---- internals -----------------------------------------------------------------------------

    def _generate(self) -> tuple[int, str, bytes]:
        # one draw of random bits for the event's choices, one for its eid
        bits = self._rng.getrandbits(64)
        eid = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        seq = len(self._all) + 1
        order_number = f"o-{bits % ORDER_POOL}"
        partition = zlib.crc32(order_number.encode()) % len(self._partitions)
        occurred = _EPOCH + timedelta(seconds=seq, milliseconds=(bits >> 40) % 1000)
        event = {
            "metadata": {
                "eid": eid,
                "occurred_at": f"{occurred:%Y-%m-%dT%H:%M:%S}.{occurred.microsecond // 1000:03d}Z",
                "event_type": self.name,
                "partition": str(partition),
            },
            "order_number": order_number,
            "amount": 1 + (bits >> 16) % 99900 / 100,
            "seq": seq,
        }
        return partition, eid, json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()

    def _publish(self, partition: int, eid: str, data: bytes) -> None:
        p = self._partitions[partition]
        p.events.append(data)
        p.eids.append(eid)
        self._all[eid] = data
        self._published += 1

    def _partition(self, partition: int) -> _Partition:
        if not 0 <= partition < len(self._partitions):
            raise UnknownPartitionError(f"partition {partition} does not exist in event type {self.name}")
        return self._partitions[partition]
