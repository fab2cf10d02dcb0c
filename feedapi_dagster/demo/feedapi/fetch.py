"""A fetch of the FeedAPI demo server: its query, parsed and checked as each dialect asks for it (a
`FetchError` is the 400, 404 or 409 to answer), and the cursors it carries."""

from __future__ import annotations

import hmac
import math
import re
from dataclasses import dataclass

from feedapi_dagster.demo.feedapi.demo_feed import Event

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 100_000
DRAFT_FILTERS = ("type",)
STREAM_BATCH = 1000  # the events a stream sends at most per write (its pageSizeHint, which it has not)

# Cursors encode the global seq, zero-padded so that they also sort as strings.
_CURSOR = re.compile(r"c[0-9a-f]{12}")


def encode_cursor(seq: int) -> str:
    return f"c{seq:012x}"


class FetchError(Exception):
    """A request the server answers with `status` and `message` (plain text)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class Fetch:
    partition: int
    cursor: str
    limit: int
    types: frozenset[str] | None = None  # event-type filter; None keeps every event
    include: bool = True  # keep the listed types (True) or skip them (False)
    stream: float | None = None  # the draft's `stream`: seconds to keep the response open (inf: `y`)

    def keeps(self, event: Event) -> bool:
        return self.types is None or (event.type in self.types) == self.include


def parse_v1(pairs: list[tuple[str, str]], params: dict[str, str], partition_count: int) -> Fetch:
    cursors = [(key, value) for key, value in pairs if key.startswith("cursor")]
    if not cursors:
        raise FetchError(400, "no cursors")
    if len(cursors) > 1:
        raise FetchError(400, "exactly one cursor<i> per call is supported")
    n = _int_param(params.get("n"), "n")
    if n != partition_count:
        raise FetchError(400, f"n={n} but the feed has {partition_count} partitions")
    key, cursor = cursors[0]
    return _fetch(_int_param(key[len("cursor") :], key), cursor, params.get("pagesizehint"))


def parse_draft(pairs: list[tuple[str, str]], params: dict[str, str], streams: bool) -> Fetch:
    """`streams`: the server offers `stream` (its discovery says so)."""
    filters = {key[len("filter-") :]: value for key, value in pairs if key.startswith("filter-")}
    unsupported = sorted(set(filters) - set(DRAFT_FILTERS))
    if unsupported:
        raise FetchError(400, f"unsupported filter(s): {', '.join(unsupported)}")
    fetch = _fetch(_int_param(params.get("partition"), "partition"), params.get("cursor"), params.get("pageSizeHint"))
    if "type" in filters:
        fetch.types = frozenset([filters["type"]])
    if "stream" in params:
        if not streams:
            raise FetchError(400, "stream is not supported by this feed")
        if "pageSizeHint" in params:
            raise FetchError(400, "stream and pageSizeHint are not compatible")
        fetch.stream, fetch.limit = _stream_seconds(params["stream"]), STREAM_BATCH
    return fetch


def parse_published(params: dict[str, str], discovery_token: str, ignore_filters: bool) -> Fetch:
    if "token" not in params:
        raise FetchError(400, "missing token")
    if not hmac.compare_digest(params["token"], discovery_token):
        raise FetchError(409, "token is outdated: run discovery again")
    include, skip = params.get("event-types"), params.get("skip-event-types")
    if include is not None and skip is not None:
        raise FetchError(400, "event-types and skip-event-types are mutually exclusive")
    fetch = _fetch(_int_param(params.get("partition"), "partition"), params.get("cursor"), params.get("pagesizehint"))
    types = include if include is not None else skip
    if types is not None and not ignore_filters:
        fetch.types, fetch.include = frozenset(types.split(";")), include is not None
    return fetch


def _fetch(partition: int, cursor: str | None, hint: str | None) -> Fetch:
    if cursor is None:
        raise FetchError(400, "missing cursor")
    if cursor not in ("_first", "_last") and not _CURSOR.fullmatch(cursor):
        raise FetchError(400, f"malformed cursor: {cursor!r}")
    limit = DEFAULT_PAGE_SIZE if hint is None else _int_param(hint, "page size hint")
    if limit < 1:
        raise FetchError(400, "page size hint must be >= 1")
    return Fetch(partition, cursor, min(limit, MAX_PAGE_SIZE))


def _stream_seconds(value: str) -> float:
    """`stream`: milliseconds, or `y` for no end."""
    if value == "y":
        return math.inf
    milliseconds = _int_param(value, "stream")
    if milliseconds < 0:
        raise FetchError(400, "stream must be a number of milliseconds >= 0, or y")
    return milliseconds / 1000


def _int_param(value: str | None, name: str) -> int:
    if value is None:
        raise FetchError(400, f"missing {name}")
    try:
        return int(value)
    except ValueError:
        raise FetchError(400, f"{name} must be an integer, not {value!r}") from None
