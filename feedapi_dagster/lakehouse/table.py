"""The Delta table of a feed: its schema, and how raw events become its rows.

The columns are derived in Python, once per event, with msgspec: object payloads keep the exact bytes
the feed sent (no JSON re-serialisation anywhere), string payloads are stored as the string itself,
and the event id is read from the configured field without decoding the rest of the payload.
"""
from __future__ import annotations

import datetime as dt
import re
from array import array
from dataclasses import dataclass, field
from itertools import accumulate

import msgspec
import pyarrow as pa

TIMESTAMP = pa.timestamp("us", tz="UTC")
# What the loader hands the sink: everything but the commit's own columns.
EVENT_SCHEMA = pa.schema([
    ("partition_id", pa.int32()), ("position", pa.int64()), ("cursor", pa.string()), ("payload", pa.string()),
    ("payload_type", pa.string()), ("event_id", pa.string()),
])
TABLE_SCHEMA = pa.schema([*EVENT_SCHEMA, ("loaded_at", TIMESTAMP), ("run_id", pa.string())])
PARTITION_COLUMN = "partition_id"
_ID_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KINDS = (b"object", b"string", b"array", b"boolean", b"null", b"number")
_KIND_INDEX = {ord("{"): 0, ord('"'): 1, ord("["): 2, ord("t"): 3, ord("f"): 3, ord("n"): 4}
_STRING, _NUMBER = 1, 5
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def check_id_field(event_id_field: str) -> str:
    if not _ID_FIELD.fullmatch(event_id_field):
        raise ValueError(f"event_id_field must be a plain field name ([A-Za-z_][A-Za-z0-9_]*), got {event_id_field!r}")
    return event_id_field


class EventParser:
    """Type, id and stored text of raw JSON payloads (already validated by the page reader)."""

    def __init__(self, event_id_field: str = "id"):
        self.event_id_field = check_id_field(event_id_field)
        self._ids = msgspec.json.Decoder(
            msgspec.defstruct("EventId", [(event_id_field, msgspec.Raw | msgspec.UnsetType, msgspec.UNSET)]))

    def event_id(self, raw: bytes) -> bytes | None:
        """The id field of an object payload as UTF-8: a string id as its value, any other JSON value
        as its text."""
        if raw[:1] != b"{":
            return None
        value = getattr(self._ids.decode(raw), self.event_id_field)
        if value is msgspec.UNSET:
            return None
        value = bytes(value)
        if value[:1] != b'"':
            return value
        return value[1:-1] if b"\\" not in value else msgspec.json.decode(value).encode()


@dataclass
class EventBatch:
    """Rows collected across pages and partitions until the loader commits them, kept as the bytes
    the Arrow columns are built from (a page's cursor and an event's kind as indexes: one per page,
    a handful in all)."""

    partition_ids: array = field(default_factory=lambda: array("i"))
    positions: array = field(default_factory=lambda: array("q"))
    cursors: list[bytes] = field(default_factory=list)
    cursor_index: array = field(default_factory=lambda: array("i"))
    payloads: list[bytes] = field(default_factory=list)
    kind_index: array = field(default_factory=lambda: array("b"))
    event_ids: list[bytes | None] = field(default_factory=list)
    size: int = 0

    def __len__(self) -> int:
        return len(self.payloads)

    def add(self, partition_id: int, position: int, cursor: str, raws: list[bytes],
            event_ids: list[bytes | None]) -> None:
        count = len(raws)
        self.partition_ids.extend(array("i", [partition_id]) * count)
        self.positions.extend(range(position, position + count))
        self.cursor_index.extend(array("i", [len(self.cursors)]) * count)
        self.cursors.append(cursor.encode())
        self.event_ids.extend(event_ids)
        kinds = array("b", [_KIND_INDEX.get(raw[0], _NUMBER) for raw in raws])
        self.kind_index.extend(kinds)
        if _STRING in kinds:
            # a string payload is stored as the string itself, every other value as the JSON text sent
            raws = [msgspec.json.decode(raw).encode() if kind == _STRING else raw for raw, kind in zip(raws, kinds)]
        self.payloads.extend(raws)
        self.size += sum(map(len, raws))

    def to_arrow(self) -> pa.Table:
        return pa.Table.from_arrays([
            _fixed(pa.int32(), self.partition_ids), _fixed(pa.int64(), self.positions),
            _strings(self.cursors).take(_fixed(pa.int32(), self.cursor_index)), _strings(self.payloads),
            _KIND_NAMES.take(_fixed(pa.int8(), self.kind_index)), _strings(self.event_ids),
        ], schema=EVENT_SCHEMA)


def stamped(events: pa.Table, loaded_at: dt.datetime, run_id: str | None) -> pa.Table:
    """Events plus the columns of the commit that stores them."""
    count = events.num_rows
    micros = (loaded_at - _EPOCH) // dt.timedelta(microseconds=1)
    run_ids = pa.nulls(count, pa.string()) if run_id is None else _strings([run_id.encode()] * count)
    return (events.append_column("loaded_at", _fixed(TIMESTAMP, array("q", [micros]) * count))
            .append_column("run_id", run_ids))


# Arrow columns are built from buffers: converting Python objects (`pa.array(list)`) makes pyarrow
# import pandas on first use, ~1.5 s of every run's first commit.
def _fixed(kind: pa.DataType, values: array) -> pa.Array:
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def _strings(texts: list[bytes | None]) -> pa.Array:
    """A string array straight from UTF-8 bytes (None: null), with one copy and no decoding."""
    count = len(texts)
    validity = None
    if None in texts:
        bits = bytearray((count + 7) // 8)
        for index, text in enumerate(texts):
            if text is not None:
                bits[index >> 3] |= 1 << (index & 7)
        validity = pa.py_buffer(bits)
        texts = [b"" if text is None else text for text in texts]
    offsets = array("q", accumulate(map(len, texts), initial=0))
    return pa.LargeStringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(b"".join(texts)),
                                            validity).cast(pa.string())


_KIND_NAMES = _strings(list(_KINDS))
