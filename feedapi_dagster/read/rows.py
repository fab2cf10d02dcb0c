"""The Delta table of a feed: its schema, and how raw events become its rows.

The columns are derived once per group of events, with Arrow compute kernels over the payloads laid
end to end (one `bytes` join), so that Python code runs per group, not per event: object payloads
keep the exact bytes the feed sent (no JSON re-serialisation anywhere), string payloads are stored as
the string itself (decoded by msgspec), and the event id is read from the configured field without
decoding the rest of the payload when it is the object's first field (a regular expression anchored
at the payload's start); otherwise msgspec finds it, in one decode of the group's other objects.
Arrow arrays are built from buffers and compute kernels, never from Python objects: converting those
(`pa.array(list)`, `pa.scalar`) makes pyarrow import pandas, ~1.5 s of every run's first commit.
"""

from __future__ import annotations

import functools
import re
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter, mul, sub

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from feedapi_dagster.protocol.feedapi.lines import json_fields

TIMESTAMP = pa.timestamp("us", tz="UTC")
# What the loader hands the sink: everything but the commit's own columns.
EVENT_SCHEMA = pa.schema(
    [
        ("partition_id", pa.int32()),
        ("position", pa.int64()),
        ("cursor", pa.string()),
        ("payload", pa.string()),
        ("payload_type", pa.string()),
        ("event_id", pa.string()),
    ]
)
TABLE_SCHEMA = pa.schema([*EVENT_SCHEMA, ("loaded_at", TIMESTAMP), ("run_id", pa.string())])
PARTITION_COLUMN = "partition_id"
_SPARK_TYPES = {pa.int32(): "INT", pa.int64(): "BIGINT", pa.string(): "STRING", TIMESTAMP: "TIMESTAMP"}


def spark_ddl(schema: pa.Schema) -> str:
    """The schema as Spark's column DDL (`partition_id INT, position BIGINT, ...`)."""
    return ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in schema)


_ID_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def check_id_field(event_id_field: str) -> str:
    if not _ID_FIELD.fullmatch(event_id_field):
        raise ValueError(
            "event_id_field must be a field name ([A-Za-z_][A-Za-z0-9_]*), or names joined by dots "
            f"for a nested field (metadata.eid), got {event_id_field!r}"
        )
    return event_id_field


def event_ids(raws: Sequence[bytes], event_id_field: str) -> list[bytes | None]:
    """The first top-level id field of each object payload as UTF-8 (a string id as its value, any other
    JSON value as its text), else None: the ids that the `event_id` column holds."""
    payloads, firsts = _payloads(raws)
    objects = pc.equal(pc.take(_KIND_OF_BYTE, firsts), _KIND_CODES_ARRAY[_OBJECT_KIND])
    return _ids(payloads, objects, event_id_field).to_pylist()


@dataclass
class EventBatch:
    """Runs of pages collected until they are handed on: payloads as the raw bytes the columns derive
    from, each page's end and cursor, positions per run."""

    event_id_field: str = "id"
    partition_ids: array = field(default_factory=lambda: array("i"))
    positions: list[tuple[int, int]] = field(default_factory=list)  # (first position, count) of each run
    payloads: list[Sequence[bytes]] = field(default_factory=list)  # each run's, as added
    ends: list[int] = field(default_factory=list)
    cursors: list[str] = field(default_factory=list)
    size: int = 0
    count: int = 0

    def __len__(self) -> int:
        return self.count

    def add(
        self,
        partition_id: int,
        position: int,
        raws: Sequence[bytes],
        ends: list[int],
        cursors: list[str],
        size: int | None = None,
    ) -> None:
        """Pages of one partition from `position` on: page i holds `raws[ends[i-1]:ends[i]]`, covered by
        `cursors[i]` (a `PageRun`'s layout); `size`: their payload bytes, when known."""
        count, before = len(raws), self.count
        self.partition_ids.extend(array("i", [partition_id]) * count)
        self.ends.extend([before + end for end in ends] if before else ends)
        self.cursors.extend(cursors)
        if count:
            self.positions.append((position, count))
            self.payloads.append(raws)
        self.count += count
        self.size += sum(map(len, raws)) if size is None else size

    def to_arrow(self) -> pa.Table:
        count = self.count
        raws = self.payloads[0] if len(self.payloads) == 1 else list(chain.from_iterable(self.payloads))
        payloads, firsts = _payloads(raws)
        kinds = pc.take(_KIND_OF_BYTE, firsts)
        strings = pc.equal(kinds, _KIND_CODES_ARRAY[_STRING_KIND])
        ids = _ids(payloads, pc.equal(kinds, _KIND_CODES_ARRAY[_OBJECT_KIND]), self.event_id_field)
        if strings.true_count:  # a string payload is stored as the string itself
            payloads = pc.replace_with_mask(payloads, strings, _unquoted(pc.filter(payloads, strings)))
        return pa.Table.from_arrays(
            [
                _fixed(pa.int32(), self.partition_ids),
                _positions(count, self.positions),
                _page_column(count, self.ends or [0], self.cursors or [""]),
                _text(payloads),
                pc.take(_KIND_NAMES, kinds),
                _text(ids),
            ],
            schema=EVENT_SCHEMA,
        )


# ------------------------------------------------------------------------------------------ payloads

# A payload's kind from its first byte, as an index into the names (JSON payloads have no blanks around).
_KIND_NAMES_LIST = ["object", "string", "array", "boolean", "null", "number"]
_OBJECT_KIND, _STRING_KIND = 0, 1
_KIND_CODES = bytearray([5]) * 256
for _byte, _code in ((b"{", 0), (b'"', 1), (b"[", 2), (b"t", 3), (b"f", 3), (b"n", 4)):
    _KIND_CODES[_byte[0]] = _code


def _payloads(raws: Sequence[bytes]) -> tuple[pa.BinaryArray, pa.UInt8Array]:
    """Payloads as an Arrow binary array, and the first byte of each (its kind)."""
    binary, lengths = _binary(raws)
    if len(binary) and pc.min_max(lengths)["min"].as_py() == 0:
        raise ValueError("payload is not valid JSON: an empty payload")
    offsets, data = binary.buffers()[1:]
    starts = pa.Array.from_buffers(pa.int32(), len(binary), [None, offsets])
    return binary, pc.take(pa.Array.from_buffers(pa.uint8(), data.size, [None, data]), starts)


def _binary(items: Sequence[bytes]) -> tuple[pa.BinaryArray, pa.Int32Array]:
    """Bytes laid end to end as an Arrow binary array, and their lengths. Two passes of builtins over
    the items: their lengths (packed as int32), then their bytes (joined)."""
    count = len(items)
    try:
        lengths = _fixed(pa.int32(), struct.pack(f"<{count}i", *map(len, items)))
    except struct.error:
        raise ValueError("more than 2 GiB of text in one column") from None
    data = b"".join(items)  # TypeError unless bytes
    if len(data) > _MAX_OFFSET:
        raise ValueError("more than 2 GiB of text in one column")
    offsets = pa.concat_arrays([_ZERO_OFFSET, pc.cumulative_sum(lengths)]).buffers()[1]
    return pa.BinaryArray.from_buffers(pa.binary(), count, [None, offsets, pa.py_buffer(data)]), lengths


_MAX_OFFSET = (1 << 31) - 1


def _unquoted(strings: pa.BinaryArray) -> pa.BinaryArray:
    """The values of JSON strings (UTF-8): without their quotes, and decoded by msgspec if escaped."""
    plain = pc.binary_slice(strings, 1, -1)
    escaped = pc.match_substring(strings, "\\")
    if not escaped.true_count:
        return plain
    quoted = pc.filter(strings, escaped)
    try:
        # JSON strings end to end are one value a string: the array's data is all their text
        texts = _STRINGS.decode_lines(_data(quoted))
        values = list(map(str.encode, texts))
    except (msgspec.DecodeError, UnicodeEncodeError) as error:
        raise ValueError(f"payload is not valid JSON: {error}") from None
    if len(values) != len(quoted):
        raise ValueError("payload is not valid JSON: a string is not one JSON string")
    return pc.replace_with_mask(plain, escaped, _binary(values)[0])


_STRINGS = msgspec.json.Decoder(str)


def _data(binary: pa.BinaryArray) -> memoryview:
    """The bytes of a binary array's values, end to end (nulls have none)."""
    _, offsets, data = binary.buffers()
    ends = memoryview(offsets).cast("B").cast("i")[binary.offset : binary.offset + len(binary) + 1]
    return memoryview(data)[ends[0] : ends[-1]] if data is not None else memoryview(b"")


# ----------------------------------------------------------------------------------------- event ids


def _ids(payloads: pa.BinaryArray, objects: pa.BooleanArray, event_id_field: str) -> pa.BinaryArray:
    """The first top-level `event_id_field` of each object payload (of the objects on its path when
    dotted: `metadata.eid`): a string id as its value, any other JSON value as its text; null when
    absent or not an object.

    An id that is its object's first field (on every level), with a string or scalar value (what feeds
    send), is read by an anchored regular expression over all payloads at once; the other objects' ids
    are found by one msgspec decode of them all, and by a walk over the fields of those where msgspec
    (which keeps the last of duplicate keys) could differ from the first one."""
    fields = pc.struct_field(pc.extract_regex(payloads, _first_field_pattern(event_id_field)), [0])
    others = pc.and_(objects, pc.is_null(fields))
    if others.true_count:
        fields = pc.replace_with_mask(fields, others, _other_ids(pc.filter(payloads, others), event_id_field))
    strings = pc.starts_with(fields, '"')  # null where no id
    count = strings.true_count
    if count == len(fields) - fields.null_count:  # every id a string (or none)
        return _unquoted(fields) if count else fields
    return pc.replace_with_mask(fields, pc.fill_null(strings, _FALSE), _unquoted(pc.filter(fields, strings)))


@functools.lru_cache(maxsize=16)
def _first_field_pattern(event_id_field: str) -> str:
    blank = r"[ \t\n\r]*"
    path = "".join(rf'\{{{blank}"{re.escape(name)}"{blank}:{blank}' for name in event_id_field.split("."))
    return rf'^{path}(?P<id>"[^"\\]*(?:\\.[^"\\]*)*"|[-+.0-9eE]+|true|false|null)'


@functools.lru_cache(maxsize=16)
def _id_decoder(event_id_field: str) -> msgspec.json.Decoder:
    """Decodes an object into holders, one a level of the path, the last holding the id's raw JSON."""
    *outer, last = event_id_field.split(".")
    holder = msgspec.defstruct("IdHolder", [("id", msgspec.Raw, msgspec.Raw())], rename={"id": last}, gc=False)
    for name in reversed(outer):
        holder = msgspec.defstruct("PathHolder", [("id", holder | None, None)], rename={"id": name}, gc=False)
    return msgspec.json.Decoder(holder)


@functools.lru_cache(maxsize=16)
def _id_getter(event_id_field: str):
    """What takes the id out of a holder of `_id_decoder`, whatever the field's name (an empty Raw: no
    such field): for a top-level field one C call a holder, as this runs for every such event."""
    if "." not in event_id_field:
        return attrgetter("id")

    def nested(holder) -> msgspec.Raw:  # noqa: ANN001 - a holder of `_id_decoder`
        while holder is not None and not isinstance(holder, msgspec.Raw):
            holder = holder.id
        return holder if holder is not None else _NO_ID

    return nested


_NO_ID = msgspec.Raw()


@functools.lru_cache(maxsize=16)
def _duplicate_pattern(event_id_field: str) -> str:
    # a field of the path twice, or a key escaped as \u00XX (what a field's letters, digits and _ escape to)
    names = "|".join(rf"{name}.*{name}" for name in (re.escape(f'"{part}"') for part in event_id_field.split(".")))
    return rf"(?s){names}|\\u00[3-7]"


def _other_ids(objects: pa.BinaryArray, event_id_field: str) -> pa.BinaryArray:
    try:
        # objects end to end are one value an object: the array's data is all their text
        holders = _id_decoder(event_id_field).decode_lines(_data(objects))
    except msgspec.MsgspecError:
        holders = None  # surrogates escaped alone (the page reader lets them through), or not JSON
    if holders is None or len(holders) != len(objects):
        return _nullable(_binary([_walked(raw, event_id_field) for raw in objects.to_pylist()])[0])
    ids = _nullable(_binary(list(map(_id_getter(event_id_field), holders)))[0])  # an empty Raw: no id field
    doubtful = pc.match_substring_regex(objects, _duplicate_pattern(event_id_field))
    if doubtful.true_count:
        walked = [_walked(raw, event_id_field) for raw in pc.filter(objects, doubtful).to_pylist()]
        ids = pc.replace_with_mask(ids, doubtful, _nullable(_binary(walked)[0]))
    return ids


def _nullable(binary: pa.BinaryArray) -> pa.BinaryArray:
    """Empty values as nulls."""
    present = pc.cast(pc.binary_length(binary), pa.bool_())
    return pa.Array.from_buffers(pa.binary(), len(binary), [present.buffers()[1], *binary.buffers()[1:]])


def _walked(raw: bytes, name: str) -> bytes:
    try:
        return _first_field(raw, name) or b""
    except (AttributeError, ValueError, IndexError):  # a regular expression found no match: not JSON
        raise ValueError(f"payload is not valid JSON: {raw[:80]!r}") from None


def _first_field(raw: bytes, path: str) -> bytes | None:
    """The raw value of the first field `path` (dotted: of the first object on the way) of the JSON
    object `raw` (valid JSON)."""
    name, _, rest = path.partition(".")
    key = f'"{name}"'.encode()
    for quoted, start, end in json_fields(raw):
        if quoted == key or b"\\" in quoted and msgspec.json.decode(quoted) == name:
            if not rest:
                return raw[start:end]
            return _first_field(raw[start:end], rest) if raw[start : start + 1] == b"{" else None
    return None


# ------------------------------------------------------------------------------------------- columns


def _page_column(count: int, ends: list[int], cursors: list[str]) -> pa.StringArray:
    """Each event's page cursor: page i holds events ends[i-1]..ends[i]."""
    sizes = list(map(sub, ends, [0, *ends]))  # events a page
    if len(ends) != len(cursors) or ends[-1] != count or min(sizes) < 0:
        raise ValueError("ends must be non-decreasing, one per cursor, the last one the number of payloads")
    values = _binary(list(map(str.encode, cursors)))[0]
    pages = b"".join(map(mul, map(_INT32.pack, range(len(ends))), sizes))  # each event's page
    return _text(pc.take(values, _fixed(pa.int32(), pages)))


def _positions(count: int, runs: list[tuple[int, int]]) -> pa.Int64Array:
    """Runs of consecutive positions: a cumulative sum of ones, but for the first of each run."""
    steps = bytearray(_ONE * count)
    at = last = 0
    for position, size in runs:
        _INT64.pack_into(steps, at * 8, position - last)
        at, last = at + size, position + size - 1
    return pc.cumulative_sum(_fixed(pa.int64(), steps))


_INT32, _INT64 = struct.Struct("<i"), struct.Struct("<q")
_ONE = _INT64.pack(1)


def _text(binary: pa.BinaryArray) -> pa.StringArray:
    # payloads are valid UTF-8 (the page reader checks each body), and so are the parts cut from them
    # at quotes, and the strings msgspec decodes: a view, not a cast that would check it again
    return binary.view(pa.string())


# Arrow columns are built from buffers: converting Python objects (`pa.array(list)`) makes pyarrow
# import pandas on first use, ~1.5 s of every run's first commit.
def _fixed(kind: pa.DataType, values: array | bytes | bytearray) -> pa.Array:
    return pa.Array.from_buffers(kind, memoryview(values).nbytes * 8 // kind.bit_width, [None, pa.py_buffer(values)])


_ZERO_OFFSET = _fixed(pa.int32(), bytes(4))
_KIND_NAMES = _binary([name.encode() for name in _KIND_NAMES_LIST])[0].cast(pa.string())
_KIND_OF_BYTE = _fixed(pa.uint8(), _KIND_CODES)
_KIND_CODES_ARRAY = _fixed(pa.uint8(), bytes(range(len(_KIND_NAMES_LIST))))  # its items: scalars for compute
_FALSE = pa.Array.from_buffers(pa.bool_(), 1, [None, pa.py_buffer(b"\0")])[0]


def _strings(count: int, data: bytes, offsets: bytes, validity: bytes | None = None) -> pa.Array:
    return pa.StringArray.from_buffers(
        count, pa.py_buffer(offsets), pa.py_buffer(data), None if validity is None else pa.py_buffer(validity)
    )
