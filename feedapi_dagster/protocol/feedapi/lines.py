"""FeedAPI NDJSON lines into events and checkpoints (`scan_lines`), for `ndjson.PageReader`.

Lines are decoded by msgspec, one decode per block (or per piece of about 1 MiB of a larger block):
the block's lines become the elements of one JSON array, each line wrapped in a one-element array so
that a line holds exactly one value, and each decodes into a `Line` whose event payload is a
`msgspec.Raw`: the raw JSON bytes the server sent (validated, never re-serialised), handed on as
`bytes`. Sorting events from checkpoints, making the payloads `bytes` and summing their sizes are
passes of builtins (`map`, `filter`, `compress`) over the lines: no Python code runs per event. A block
that this bulk decode refuses (blank lines, damage) is decoded again without its blank lines, then,
if still refused, line by line, to locate and describe the damage. `json_fields` finds an object's
top-level fields without decoding it (for lines with lone surrogates here, for event ids in
`lakehouse`).
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Iterator
from itertools import accumulate, compress, count, islice, repeat
from operator import add, attrgetter, is_not, not_, sub

import msgspec

_NO_EVENT = msgspec.Raw()  # a present payload is never empty, so an empty Raw means "no event"


class _EventLine(msgspec.Struct, gc=False):
    """A protocol line (dialects with `event`): an event's payload, or a checkpoint. A line with both is
    an event; a line with neither, or a `null` cursor, is a command of a future revision. `gc=False`:
    a block's hundred thousand lines are not tracked by the garbage collector (they hold no cycles)."""

    event: msgspec.Raw = _NO_EVENT
    cursor: str | int | None = None


class _DataLine(msgspec.Struct, gc=False):
    """A protocol line of the dialects with `data`."""

    event: msgspec.Raw = msgspec.field(default=_NO_EVENT, name="data")
    cursor: str | int | None = None


class _EventRow(msgspec.Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    """A line wrapped as `[line]`: two values on one line (`[{…},{…}]`) or none (`[]`) do not decode."""

    line: _EventLine


class _DataRow(msgspec.Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    """A line of the dialects with `data`, wrapped as `[line]`."""

    line: _DataLine


_LINES = {"event": _EventLine, "data": _DataLine}
EVENT_KEYS = frozenset(_LINES)  # the dialects' names of an event's payload field
_ROWS: dict[str, msgspec.json.Decoder[list[_EventRow] | list[_DataRow]]] = {
    "event": msgspec.json.Decoder(list[_EventRow]),
    "data": msgspec.json.Decoder(list[_DataRow]),
}
_LINE = {key: msgspec.json.Decoder(line) for key, line in _LINES.items()}
_PAYLOAD, _CURSOR = attrgetter("event"), attrgetter("cursor")
_ROW_PAYLOAD, _ROW_CURSOR = attrgetter("line.event"), attrgetter("line.cursor")

Damage = tuple[str, int, int, str]  # kind (`utf8` | `json`), line start, line end, message
Scan = tuple[list[bytes], list[int], list[int], list[str], int, Damage | None]


def scan_lines(block: bytes, event_key: str) -> Scan:
    """The lines of `block` up to the first damaged one: the events' payloads (raw JSON bytes); for each
    checkpoint, the number of events before it, their payload bytes and its cursor; the payload bytes
    of all events; the damage as (kind `utf8`|`json`, line start, line end, message), or None.

    Blank lines are skipped (as `bytes.isspace` sees blanks); a line must be one JSON object. A large
    block is scanned in pieces of about `_PIECE` bytes (cut after a newline): the copies that a decode
    makes then stay in the CPU's caches."""
    if len(block) <= _PIECE:
        return _scan(block, event_key)
    events: list[bytes] = []
    ends: list[int] = []
    sizes: list[int] = []
    cursors: list[str] = []
    size = start = 0
    while start < len(block):
        cut = block.find(b"\n", start + _PIECE)
        end = len(block) if cut < 0 else cut + 1
        piece_events, piece_ends, piece_sizes, piece_cursors, piece_size, damage = _scan(block[start:end], event_key)
        ends += map(add, piece_ends, repeat(len(events)))
        sizes += map(add, piece_sizes, repeat(size))
        cursors += piece_cursors
        events += piece_events
        size += piece_size
        if damage is not None:
            kind, line_start, line_end, message = damage
            return events, ends, sizes, cursors, size, (kind, start + line_start, start + line_end, message)
        start = end
    return events, ends, sizes, cursors, size, None


_PIECE = 1 << 20


def _scan(block: bytes, event_key: str) -> Scan:
    if _is_utf8(block):
        lines = _bulk(block, event_key)
        if lines is None:  # blank lines (a server's keep-alives?), or damage: again without the blanks
            lines = _bulk_without_blanks(block, event_key)
        if lines is not None:
            return (*_sort(lines), None)
    return _line_by_line(block, event_key)


def _is_utf8(block: bytes) -> bool:
    if block.isascii():
        return True
    import pyarrow as pa  # Arrow's UTF-8 validation: ~2 ms for 25 MB, without making a str of it

    offsets = pa.py_buffer(array("q", (0, len(block))))
    try:
        pa.LargeStringArray.from_buffers(1, offsets, pa.py_buffer(block)).validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _bulk(block: bytes, event_key: str) -> list | None:
    """The lines of `block` from one decode, or None unless each line decodes to one line object.

    Each newline becomes `],[` and the block `[[…]]`: a line holding two values, or none (a blank
    line), does not decode, and a value spanning lines is one row for two lines, found by counting."""
    wrapped = block.replace(b"\n", b"],[")
    newlines = (len(wrapped) - len(block)) >> 1
    if block.endswith(b"\n"):
        text = b"".join((b"[[", memoryview(wrapped)[:-2], b"]"))
        lines = newlines
    else:
        text = b"".join((b"[[", wrapped, b"]]"))
        lines = newlines + 1
    try:
        rows = _ROWS[event_key].decode(text)
    except (msgspec.DecodeError, RecursionError):
        return None
    return rows if len(rows) == lines else None


def _bulk_without_blanks(block: bytes, event_key: str) -> list | None:
    """As `_bulk`, for the lines of `block` that are not blank."""
    lines = [line for line in block.split(b"\n") if line and not line.isspace()]
    if not lines:
        return []
    try:
        rows = _ROWS[event_key].decode(b"".join((b"[[", b"],[".join(lines), b"]]")))
    except (msgspec.DecodeError, RecursionError):
        return None
    return rows if len(rows) == len(lines) else None


def _sort(
    lines: list, payload=_ROW_PAYLOAD, line_cursor=_ROW_CURSOR
) -> tuple[list[bytes], list[int], list[int], list[str], int]:
    """Events and checkpoints of decoded lines (rows, or lines with the getters of lines), by passes of
    builtins over the lines: no Python code runs per event, nor per checkpoint."""
    payloads = list(map(payload, lines))  # an empty Raw for a line without event
    others = list(compress(count(), map(not_, payloads)))  # indices of the lines without event
    if not others:
        return list(map(bytes, payloads)), [], [], [], sum(map(len, payloads))
    events = list(map(bytes, filter(None, payloads)))
    cursors = list(map(line_cursor, map(lines.__getitem__, others)))
    ends = list(map(sub, others, count()))  # events before each
    if None in cursors:  # commands of a future revision: no checkpoint
        kept = list(map(is_not, cursors, repeat(None)))
        others, ends, cursors = list(compress(others, kept)), list(compress(ends, kept)), list(compress(cursors, kept))
    lengths = map(len, payloads)  # 0 for the other lines
    # payload bytes before each checkpoint: the lengths summed from one checkpoint's line to the next's
    sizes = list(accumulate(map(sum, map(islice, repeat(lengths), map(sub, others, [0, *others])))))
    size = (sizes[-1] if sizes else 0) + sum(lengths)
    return events, ends, sizes, list(map(str, cursors)), size


def _line_by_line(block: bytes, event_key: str) -> Scan:
    """The lines of `block` decoded one by one up to the first damaged one, which is described."""
    decoder = _LINE[event_key]
    lines = []
    damage = None
    start, length = 0, len(block)
    while start < length:
        end = block.find(b"\n", start)
        if end < 0:
            end = length
        raw = block[start:end]
        line_start, start = start, end + 1
        if not raw or raw.isspace():
            continue
        if not raw.isascii():
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                damage = ("utf8", line_start, end, "body is not valid UTF-8")
                break
        try:
            line = decoder.decode(raw)
        except msgspec.ValidationError as error:
            damage = ("json", line_start, end, _invalid(str(error)))
            break
        except msgspec.DecodeError as error:
            line = _with_lone_surrogates(raw, event_key)
            if line is None:
                damage = ("json", line_start, end, _malformed(str(error)))
                break
        except RecursionError:
            damage = ("json", line_start, end, "recursion limit exceeded")
            break
        lines.append(line)
    return (*_sort(lines, _PAYLOAD, _CURSOR), damage)


# A UTF-16 surrogate escaped alone (`"\\ud800"`) is valid JSON text but no Unicode: msgspec refuses it
# anywhere, serde_json (the Rust reader's) only where it decodes a string, and JavaScript's
# JSON.stringify writes one for a broken string. Lines with one are read by Python's json module.
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


class _Pairs(list):
    """An object's fields as Python's json module reads them, duplicates kept."""


def _with_lone_surrogates(raw: bytes, event_key: str):
    """The line `raw` that msgspec refused, if only for surrogates escaped alone in its payload or in
    fields it ignores (not in its keys or cursor, which are decoded); else None."""
    if _SURROGATE.search(raw) is None:
        return None
    try:
        fields = json.loads(raw, object_pairs_hook=_Pairs, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    if fields.__class__ is not _Pairs:
        return None
    cursor = None
    for key, value in fields:
        if not _is_unicode(key):
            return None
        if key == "cursor":
            if value.__class__ is str and not _is_unicode(value) or value.__class__ not in (str, int, type(None)):
                return None
            cursor = value
    event = None
    for key, start, end in json_fields(raw):
        if (json.loads(key) if b"\\" in key else key[1:-1].decode()) == event_key:
            event = raw[start:end]  # the last one, as decoders keep the last of duplicate keys
    if event is None:
        return _LINES[event_key](cursor=cursor)
    return _LINES[event_key](msgspec.Raw(event), cursor)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _is_unicode(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


_SPACE = re.compile(rb"[ \t\n\r]*")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_SCALAR = re.compile(rb"[^,}\] \t\n\r]*")
_NESTING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def json_fields(raw: bytes) -> Iterator[tuple[bytes, int, int]]:
    """The top-level fields of the JSON object `raw` (valid JSON), in order: each key as sent, quotes
    and escapes included, and where its value starts and ends in `raw`. Nothing is decoded."""
    at = _past(_SPACE, raw, raw.index(b"{") + 1)
    while raw[at : at + 1] == b'"':
        key_end = _past(_STRING, raw, at)
        value = _past(_SPACE, raw, _past(_SPACE, raw, key_end) + 1)  # past the colon
        value_end = _value_end(raw, value)
        yield raw[at:key_end], value, value_end
        at = _past(_SPACE, raw, value_end)
        if raw[at : at + 1] != b",":
            return
        at = _past(_SPACE, raw, at + 1)


def _value_end(raw: bytes, at: int) -> int:
    first = raw[at : at + 1]
    if first == b'"':
        return _past(_STRING, raw, at)
    if first not in (b"{", b"["):
        return _past(_SCALAR, raw, at)
    depth = 0
    for token in _NESTING.finditer(raw, at):
        if token.end() - token.start() == 1:  # a bracket
            depth += 1 if raw[token.start()] in b"{[" else -1
            if depth == 0:
                return token.end()
    return len(raw)


def _past(pattern: re.Pattern[bytes], raw: bytes, at: int) -> int:
    """Where `pattern`, matched at `at`, ends: in valid JSON each of these patterns matches there (the
    spaces and scalars ones match the empty string too)."""
    match = pattern.match(raw, at)
    assert match is not None, "json_fields reads valid JSON only"
    return match.end()


_EXPECTED = re.compile(r"Expected `[^`]*`, got `([^`]*)`(?: - at `\$(.*)`)?$")
_AT_BYTE = re.compile(r"^(?:JSON is malformed: )?(.*?)(?: \(byte (\d+)\))?$")


def _invalid(message: str) -> str:
    """msgspec's validation error of a line, as what the line should have been."""
    found = _EXPECTED.match(message)
    if found is None:
        return message
    got, where = found.groups()
    if not where:
        return f"invalid type: {got}, expected a FeedAPI line object"
    if where == ".cursor":
        return f"invalid type: {got}, expected a cursor: a string, an integer or null"
    return message


def _malformed(message: str) -> str:
    """msgspec's decode error of a line, with where in the line: `trailing characters at line 1 column 13`."""
    found = _AT_BYTE.match(message)
    assert found is not None  # its groups are optional: it matches every message
    what, at = found.groups()
    what = what[:1].lower() + what[1:]
    return what if at is None else f"{what} at line 1 column {int(at) + 1}"
