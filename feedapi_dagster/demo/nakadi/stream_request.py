"""What a stream request of the demo Nakadi server asks for, parsed and checked: its parameters and its
cursors (also the partitions endpoint's), a `Problem` when they are wrong."""

from __future__ import annotations

import json
from dataclasses import dataclass

from feedapi_dagster.demo.nakadi.event_type import NakadiEventType
from feedapi_dagster.demo.nakadi.problems import Problem

# the spec: a stream_timeout above this is treated as none given
MAX_STREAM_TIMEOUT = 4200.0
DEFAULT_BATCH_FLUSH_TIMEOUT = 30.0


@dataclass(slots=True)
class StreamRequest:
    cursors: list[tuple[int, int, str]]  # (partition, last consumed offset, the offset as requested)
    batch_limit: int
    stream_limit: int  # 0: unlimited
    batch_flush_timeout: float
    stream_timeout: float  # 0: no limit
    keep_alive_limit: int  # 0: unlimited


def parse_stream_request(
    params: dict[str, str], cursors_header: str | None, event_type: NakadiEventType
) -> StreamRequest:
    """The stream a GET /event-types/{name}/events asks for: its query `params` and its X-Nakadi-Cursors."""
    batch_limit = int(_number(params, "batch_limit", 1, integer=True))
    stream_limit = int(_number(params, "stream_limit", 0, integer=True))
    flush = _number(params, "batch_flush_timeout", 0) or DEFAULT_BATCH_FLUSH_TIMEOUT  # 0: 30 s, as the spec says
    stream_timeout = _number(params, "stream_timeout", 0)
    keep_alive_limit = int(_number(params, "stream_keep_alive_limit", 0, integer=True))
    if stream_timeout > MAX_STREAM_TIMEOUT:
        stream_timeout = 0.0  # the spec: treated as not given
    if batch_limit < 1:
        raise Problem(422, "batch_limit can't be lower than 1")
    if min(stream_limit, flush, stream_timeout, keep_alive_limit) < 0:
        raise Problem(422, "stream_limit, batch_flush_timeout, stream_timeout and stream_keep_alive_limit must be >= 0")
    if stream_limit and stream_limit < batch_limit:
        raise Problem(422, "stream_limit can't be lower than batch_limit")
    if stream_timeout and stream_timeout < flush:
        raise Problem(422, "stream_timeout can't be lower than batch_flush_timeout")
    if cursors_header is None:
        # real Nakadi then streams every partition from its newest event; the demo wants cursors
        raise Problem(400, "the X-Nakadi-Cursors header is required by this demo server")
    cursors: list[tuple[int, int, str]] = []
    for partition, offset in parse_cursors(cursors_header, "X-Nakadi-Cursors"):
        if any(p == partition for p, _, _ in cursors):
            raise Problem(422, f"partition {partition} appears more than once in X-Nakadi-Cursors")
        try:
            cursors.append((partition, event_type.resolve(partition, offset), offset))
        except (LookupError, ValueError) as e:
            raise Problem(422, str(e)) from None
    if not cursors:
        raise Problem(422, "X-Nakadi-Cursors lists no cursor")
    return StreamRequest(cursors, batch_limit, stream_limit, flush, stream_timeout, keep_alive_limit)


def _number(params: dict[str, str], name: str, default: float, *, integer: bool = False) -> float:
    value = params.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value) if integer else float(value)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise Problem(400, f"{name} must be {kind}, not {value!r}") from None


def partition_id(value: object, status: int) -> int:
    """A partition id as Nakadi writes it (a decimal string; an int is tolerated)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    raise Problem(status, f'malformed partition {value!r}: expected a partition id such as "0"')


def parse_cursors(text: str, where: str) -> list[tuple[int, str]]:
    """[(partition, offset)] of a JSON list of `Cursor`s; a 422 Problem if it is not one."""
    try:
        value = json.loads(text)
    except ValueError:
        raise Problem(422, f"{where} is not valid JSON") from None
    if not isinstance(value, list):
        raise Problem(422, f"{where} must be a JSON list of cursors")
    cursors: list[tuple[int, str]] = []
    for cursor in value:
        if not isinstance(cursor, dict) or not isinstance(cursor.get("offset"), str) or "partition" not in cursor:
            raise Problem(422, f'{where}: every cursor must be an object {{"partition": "0", "offset": "BEGIN"}}')
        cursors.append((partition_id(cursor["partition"], 422), cursor["offset"]))
    return cursors
