"""The Delta table of a feed: its schema, and how raw events become its rows.

The columns are derived in Rust (`feedapi_native.table_columns`), once per group of events: object
payloads keep the exact bytes the feed sent (no JSON re-serialisation anywhere), string payloads are
stored as the string itself, and the event id is read from the configured field without decoding the
rest of the payload.
"""
from __future__ import annotations

import datetime as dt
import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import feedapi_native
import pyarrow as pa
from feedapi_native import Payloads

TIMESTAMP = pa.timestamp("us", tz="UTC")
# What the loader hands the sink: everything but the commit's own columns.
EVENT_SCHEMA = pa.schema([
    ("partition_id", pa.int32()), ("position", pa.int64()), ("cursor", pa.string()), ("payload", pa.string()),
    ("payload_type", pa.string()), ("event_id", pa.string()),
])
TABLE_SCHEMA = pa.schema([*EVENT_SCHEMA, ("loaded_at", TIMESTAMP), ("run_id", pa.string())])
PARTITION_COLUMN = "partition_id"
_ID_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def check_id_field(event_id_field: str) -> str:
    if not _ID_FIELD.fullmatch(event_id_field):
        raise ValueError(f"event_id_field must be a plain field name ([A-Za-z_][A-Za-z0-9_]*), got {event_id_field!r}")
    return event_id_field


def event_ids(raws: Sequence[bytes], event_id_field: str) -> list[bytes | None]:
    """The id field of each object payload as UTF-8 (a string id as its value, any other JSON value as
    its text), else None: the ids that the `event_id` column holds."""
    return feedapi_native.event_ids(_payloads(raws), event_id_field)


def _payloads(raws: Sequence[bytes]) -> Payloads:
    # the reader hands `Payloads` (spans of response blocks); filtered or deduplicated runs are lists
    return raws if isinstance(raws, Payloads) else Payloads(raws)


@dataclass
class EventBatch:
    """Runs of pages collected until they are handed on: payloads as the raw bytes the columns derive
    from, each page's end and cursor, positions per run."""

    event_id_field: str = "id"
    partition_ids: array = field(default_factory=lambda: array("i"))
    positions: array = field(default_factory=lambda: array("q"))
    payloads: list[Payloads] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    cursors: list[str] = field(default_factory=list)
    size: int = 0
    count: int = 0

    def __len__(self) -> int:
        return self.count

    def add(self, partition_id: int, position: int, raws: Sequence[bytes], ends: list[int], cursors: list[str],
            size: int | None = None) -> None:
        """Pages of one partition from `position` on: page i holds `raws[ends[i-1]:ends[i]]`, covered by
        `cursors[i]` (a `PageRun`'s layout); `size`: their payload bytes, when known."""
        raws = _payloads(raws)
        count, before = len(raws), self.count
        self.partition_ids.extend(array("i", [partition_id]) * count)
        self.positions.extend(range(position, position + count))
        self.ends.extend([before + end for end in ends] if before else ends)
        self.cursors.extend(cursors)
        self.payloads.append(raws)
        self.count += count
        self.size += raws.nbytes if size is None else size

    def to_arrow(self) -> pa.Table:
        count = self.count
        payloads, kinds, ids, cursors = feedapi_native.table_columns(
            self.payloads, self.event_id_field, self.ends or [0], self.cursors or [""])
        return pa.Table.from_arrays([
            _fixed(pa.int32(), self.partition_ids), _fixed(pa.int64(), self.positions), _strings(count, *cursors),
            _strings(count, *payloads), _strings(count, *kinds), _strings(count, *ids),
        ], schema=EVENT_SCHEMA)


def stamped(events: pa.Table, loaded_at: dt.datetime, run_id: str | None) -> pa.Table:
    """Events plus the columns of the commit that stores them."""
    count = events.num_rows
    micros = (loaded_at - _EPOCH) // dt.timedelta(microseconds=1)
    if run_id is None:
        run_ids = pa.nulls(count, pa.string())
    else:  # from buffers: `pa.repeat` imports pandas
        text = run_id.encode()
        run_ids = _strings(count, text * count, array("i", range(0, len(text) * (count + 1), len(text))).tobytes())
    return (events.append_column("loaded_at", _fixed(TIMESTAMP, array("q", [micros]) * count))
            .append_column("run_id", run_ids))


# Arrow columns are built from buffers: converting Python objects (`pa.array(list)`) makes pyarrow
# import pandas on first use, ~1.5 s of every run's first commit.
def _fixed(kind: pa.DataType, values: array) -> pa.Array:
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def _strings(count: int, data: bytes, offsets: bytes, validity: bytes | None = None) -> pa.Array:
    return pa.StringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(data),
                                       None if validity is None else pa.py_buffer(validity))
