"""The in-memory event feed behind the demo server.

The model is a set of partition logs. Every publication gets a global sequence number that grows
across the whole feed, so one number ("read after seq N") is a valid position on any partition: that
is what makes an ancestor's cursor valid on a method-2 child, whose log is a subset of the ancestor's.
The feed knows nothing about HTTP or dialects; `server.py` frames it.
"""

from __future__ import annotations

import base64
import bisect
import json
import zlib
from dataclasses import dataclass, field
from typing import NamedTuple

from feedapi_dagster.demo.seeded import SeededFeed
from feedapi_dagster.protocol.models import MAX_PARTITION_ID

EVENT_TYPES = ("order.created", "order.paid", "order.shipped")

# One `data` body per event type, formatted with (amount, small number). They are raw JSON text on
# purpose: non-ASCII as UTF-8, escapes kept as written (\" \\ \n \u0000 \u00e9, a surrogate pair, \/),
# deep nesting, and numbers (1.0, 1e3, 0.10, -0.0, 1E2, a 20-digit int) whose re-serialisation would
# differ from what was sent.
_DATA_TEMPLATES = (
    r'{"customer":"Grüße aus Köln","city":"日本 東京","note":"say \"hi\" \\ C:\\temp\nnext \u0000 \u00e9'
    r' \ud83d\ude00 🎉","amount":%d.0,"lines":[{"sku":"A-%d","qty":1e3,"tags":["🎉",null,true]}]}',
    r'{"amount":%d.%02d,"fee":1.0,"rate":2.5e-3,"method":"card","meta":{"nested":{"deeper":[1,[2,[3]]]},'
    r'"empty":{},"list":[]}}',
    r'{"carrier":"Pöst ✈","tracking":"TR%08d-%d","weight_kg":0.10,"dims":[1E2,-0.0,12345678901234567890],'
    r'"address":{"line":"Straße 1\tHof \/ rear","zip":"0150"}}',
)
# whole payloads as UTF-8 bytes, formatted with (event number, aggregate, seq, amount, small number):
# a single bytes % per event, with no str to encode afterwards
_OBJECT_TEMPLATES = tuple(
    ('{"id":"e-%09d","type":"' + event_type + '","aggregate":"%s","seq":%d,"data":' + data + "}").encode()
    for event_type, data in zip(EVENT_TYPES, _DATA_TEMPLATES, strict=True)
)
_ESCAPED_STRING = rb'"line one\nline two \"quoted\" \u00e9 \/ end #%d"'


class Event(NamedTuple):  # a tuple: cheap to create a million of
    id: str | None  # the payload's "id" (deduplication key); None for strings and id-less payloads
    type: str | None  # the payload's "type", what filters match on
    aggregate: str  # routing key: all events of one aggregate live on one partition
    payload: bytes  # exact raw JSON text, UTF-8 encoded once, sent byte for byte

    def published_value(self) -> str:
        """Raw JSON text, except that a JSON string payload is returned decoded."""
        text = self.payload.decode()
        return json.loads(text) if text.startswith('"') else text


@dataclass(slots=True)
class PartitionInfo:
    """What discovery shows of a partition."""

    id: int
    closed: bool
    last_seq: int  # 0 when the partition is empty
    starts_after: int | None  # method-1 parent
    cursor_from: tuple[int, ...]  # method-2 ancestors, nearest first


@dataclass(slots=True)
class _Partition:
    id: int
    closed: bool = False
    starts_after: int | None = None
    cursor_from: tuple[int, ...] = ()
    children: list[int] = field(default_factory=list)
    vanished: bool = False  # split with method 2: no longer listed nor readable
    seqs: list[int] = field(default_factory=list)  # ascending; parallel to `events`
    events: list[Event] = field(default_factory=list)


def _hash(key: str) -> int:
    return zlib.crc32(key.encode())


class DemoFeed(SeededFeed):
    """A thread-safe feed of generated (or given) events over dynamic partitions."""

    def __init__(
        self,
        partitions: int = 4,
        events: int = 10000,
        exactly_once: bool = True,
        seed: int = 0,
        string_ratio: float = 0.2,
        duplicate_ratio: float = 0.0,
    ) -> None:
        if not 1 <= partitions <= MAX_PARTITION_ID + 1:
            raise ValueError(f"partitions must be in 1..{MAX_PARTITION_ID + 1}")
        if not (0.0 <= string_ratio <= 1.0 and 0.0 <= duplicate_ratio <= 1.0):
            raise ValueError("string_ratio and duplicate_ratio must be in [0, 1]")
        if exactly_once and duplicate_ratio:
            raise ValueError("an exactly-once feed cannot publish duplicates")
        super().__init__(seed, duplicate_ratio)
        self.exactly_once = exactly_once
        self._partitions = {pid: _Partition(pid) for pid in range(partitions)}
        self._roots = list(range(partitions))
        self._aggregate_names = [(f"agg-{i}", f"agg-{i}".encode()) for i in range(max(16, 8 * partitions))]
        self._string_threshold = round(string_ratio * 0x10000)
        self._homes: dict[str, int] = {}  # aggregate -> partition; cleared when partitions change
        self._last_seq = 0
        self._event_count = 0
        self._splits_allowed = True
        self.version = 0  # bumped on every split: the published dialect derives its token from it
        self.append(events)

    # ---- writing -------------------------------------------------------------------------------

    def append(self, count: int, partition: int | None = None) -> list[int]:
        """Generate `count` events; each goes to its aggregate's open partition, or to `partition`.

        On an at-least-once feed some object events are published again 1-5 events later in the same
        partition; every pending duplicate is flushed before returning, so `published` is final.
        """
        with self._lock:
            if partition is not None:
                self._open(partition)
            seqs: list[int] = []
            # pid -> [(publish once that log is this long, event)]
            pending: dict[int, list[tuple[int, Event]]] = {}
            for _ in range(count):
                event = self._generate()
                pid = partition if partition is not None else self._home(event.aggregate)
                seqs.append(self._publish(pid, event))
                length = len(self._partitions[pid].events)
                if pid in pending:
                    due = [e for target, e in pending[pid] if target <= length]
                    pending[pid] = [(target, e) for target, e in pending[pid] if target > length]
                    seqs.extend(self._publish(pid, e) for e in due)
                if event.id is not None and self._republishes():
                    pending.setdefault(pid, []).append((length + self._rng.randint(1, 5), event))
            for pid, later in pending.items():
                seqs.extend(self._publish(pid, e) for _, e in later)
            self.changes.bump()
            return seqs

    def add_event(self, payload_text: str, partition: int | None = None, aggregate: str | None = None) -> int:
        """Publish one event with this exact raw payload text; returns its seq.

        Any JSON value is accepted (lists and numbers too: the spec forbids them, consumers must
        survive them). Raw line breaks are rejected because they would split the NDJSON line.
        """
        value = json.loads(payload_text)  # raises ValueError on invalid JSON
        if "\n" in payload_text or "\r" in payload_text:
            raise ValueError("payload text must not contain raw line breaks")
        fields = value if isinstance(value, dict) else {}
        event = Event(
            id=_str_or_none(fields.get("id")),
            type=_str_or_none(fields.get("type")),
            aggregate=aggregate or _str_or_none(fields.get("aggregate")) or "agg-added",
            payload=payload_text.encode(),
        )
        with self._lock:
            if partition is not None:
                self._open(partition)
            seq = self._publish(partition if partition is not None else self._home(event.aggregate), event)
            self.changes.bump()
            return seq

    def close(self, partition: int) -> None:
        """No more events on `partition` (idempotent)."""
        with self._lock:
            self._visible(partition).closed = True
            self._homes.clear()
            self.changes.bump()

    def split_method1(self, partition: int, children: int = 2) -> list[int]:
        """Close the open `partition` and open empty children that start after it."""
        with self._lock:
            self._check_split(children)
            parent = self._open(partition)
            parent.closed = True
            return self._add_children(parent, children, starts_after=parent.id)

    def split_method2(self, partition: int, children: int = 2) -> list[int]:
        """Replace `partition` by children holding its whole history, redistributed by aggregate.

        The children inherit the parent's closed state: they hold its history, not new capacity.
        """
        with self._lock:
            self._check_split(children)
            parent = self._visible(partition)
            if parent.children:
                raise ValueError(f"partition {partition} was already split")
            ids = self._add_children(parent, children, cursor_from=(parent.id, *parent.cursor_from))
            for child_id in ids:
                self._partitions[child_id].closed = parent.closed
            for seq, event in zip(parent.seqs, parent.events, strict=True):
                child = self._partitions[self._child_for(parent, event.aggregate)]
                child.seqs.append(seq)  # parent seqs ascend, so each child's stay sorted
                child.events.append(event)
            parent.vanished = True
            return ids

    def forbid_splits(self) -> None:
        """For v1 (ZeroEventHub) servers, whose partition set is fixed."""
        with self._lock:
            if len(self._partitions) != len(self._roots):
                raise ValueError("this feed has been split: v1 cannot serve it")
            self._splits_allowed = False

    # ---- reading -------------------------------------------------------------------------------

    def discovery(self) -> list[PartitionInfo]:
        """The listed partitions (method-2 parents have vanished), by id."""
        with self._lock:
            return [
                PartitionInfo(p.id, p.closed, p.seqs[-1] if p.seqs else 0, p.starts_after, p.cursor_from)
                for p in sorted(self._partitions.values(), key=lambda p: p.id)
                if not p.vanished
            ]

    def read(self, partition: int, after_seq: int, limit: int) -> list[tuple[int, Event]]:
        """Up to `limit` (seq, event) publications of a listed partition with seq > after_seq."""
        with self._lock:
            p = self._visible(partition)
            start = bisect.bisect_right(p.seqs, after_seq)
            return list(zip(p.seqs[start : start + limit], p.events[start : start + limit], strict=True))

    def is_closed(self, partition: int) -> bool:
        with self._lock:
            return self._visible(partition).closed

    def last_seq(self, partition: int) -> int:
        with self._lock:
            p = self._visible(partition)
            return p.seqs[-1] if p.seqs else 0

    def partition_count(self) -> int:
        with self._lock:
            return sum(not p.vanished for p in self._partitions.values())

    def published(self, partition: int) -> list[str]:
        """Payloads in the order a consumer reading `partition` from _first receives them.

        A vanished (method-2 split) partition returns the history it had when it was split.
        """
        with self._lock:
            events = list(self._known(partition).events)
        return [event.published_value() for event in events]

    def expected_events(self, partition: int) -> list[str]:
        """`published` without repeated event ids (first occurrence kept): what a deduplicating sink holds."""
        with self._lock:
            events = list(self._known(partition).events)
        seen: set[str] = set()
        kept: list[str] = []
        for event in events:
            if event.id is not None:
                if event.id in seen:
                    continue
                seen.add(event.id)
            kept.append(event.published_value())
        return kept

    # ---- internals (caller holds the lock) -----------------------------------------------------

    def _generate(self) -> Event:
        # one draw of random bits per event, sliced into its choices: random's Python-level helpers
        # (randrange and friends) would dominate the time to build a million events
        bits = self._rng.getrandbits(64)
        self._event_count += 1
        n = self._event_count
        aggregate, aggregate_bytes = self._aggregate_names[bits % len(self._aggregate_names)]
        if (bits >> 40 & 0xFFFF) < self._string_threshold:
            if n % 4 == 0:
                payload = _ESCAPED_STRING % n
            else:
                payload = b'"' + base64.b64encode((bits * 0x9E3779B97F4A7C15).to_bytes(16, "little")) + b'"'
            return Event(None, None, aggregate, payload)
        kind = (bits >> 8) % 3
        # the payload's "seq" is the seq its first publication is about to get
        payload = _OBJECT_TEMPLATES[kind] % (n, aggregate_bytes, self._last_seq + 1, 1 + (bits >> 16) % 99999, n % 100)
        return Event(f"e-{n:09d}", EVENT_TYPES[kind], aggregate, payload)

    def _publish(self, partition: int, event: Event) -> int:
        self._last_seq += 1
        p = self._partitions[partition]
        p.seqs.append(self._last_seq)
        p.events.append(event)
        return self._last_seq

    def _home(self, aggregate: str) -> int:
        home = self._homes.get(aggregate)
        if home is None:
            home = self._homes[aggregate] = self._find_home(aggregate)
        return home

    def _find_home(self, aggregate: str) -> int:
        """The open partition for an aggregate: follow splits down from its root partition, so an
        aggregate stays where its history is; if that partition was closed without children, fall back
        to a stable choice among the open ones."""
        p = self._partitions[self._roots[_hash(aggregate) % len(self._roots)]]
        while p.children:
            p = self._partitions[self._child_for(p, aggregate)]
        if not p.closed:
            return p.id
        open_ids = sorted(q.id for q in self._partitions.values() if not q.closed and not q.vanished)
        if not open_ids:
            raise ValueError("no open partition to append to")
        return open_ids[_hash(aggregate) % len(open_ids)]

    def _child_for(self, parent: _Partition, aggregate: str) -> int:
        # salted with the parent id so that each split level spreads aggregates anew
        return parent.children[_hash(f"{aggregate}@{parent.id}") % len(parent.children)]

    def _add_children(
        self, parent: _Partition, count: int, *, starts_after: int | None = None, cursor_from: tuple[int, ...] = ()
    ) -> list[int]:
        first = max(self._partitions) + 1
        if first + count - 1 > MAX_PARTITION_ID:
            raise ValueError("partition ids exhausted")
        ids = list(range(first, first + count))
        for child in ids:
            self._partitions[child] = _Partition(child, starts_after=starts_after, cursor_from=cursor_from)
        parent.children = ids
        self.version += 1
        self._homes.clear()
        self.changes.bump()
        return ids

    def _check_split(self, children: int) -> None:
        if not self._splits_allowed:
            raise ValueError("v1 (ZeroEventHub) feeds have no splits")
        if children < 1:
            raise ValueError("children must be >= 1")

    def _known(self, partition: int) -> _Partition:
        try:
            return self._partitions[partition]
        except KeyError:
            raise ValueError(f"unknown partition {partition}") from None

    def _visible(self, partition: int) -> _Partition:
        p = self._known(partition)
        if p.vanished:
            raise ValueError(f"partition {partition} was split (method 2) and no longer exists")
        return p

    def _open(self, partition: int) -> _Partition:
        p = self._visible(partition)
        if p.closed:
            raise ValueError(f"partition {partition} is closed")
        return p


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None
