"""Nakadi event types as a `FeedProtocol`, through Nakadi's low-level API.

An event type is a feed: `GET /event-types/{name}/partitions` lists its partitions (one that a
repartitioning adds is a new partition, read from `BEGIN`), and `GET /event-types/{name}/events`
with `X-Nakadi-Cursors` streams one partition after an offset as NDJSON `EventStreamBatch`es, each a
page: its events and the offset of its last one, the cursor. The stream asks for `batch_limit =
pageSizeHint` events a batch and ends after `STREAM_TIMEOUT` seconds (then the client asks again
from its cursor); the read stops at the newest offset the partition listing gave, or at a keep-alive
batch (a cursor without events: the partition is caught up), whichever comes first. Events are kept
as the JSON Nakadi sent; their id is `metadata.eid`, and since Nakadi delivers at least once, loads
deduplicate by it.

Why the low-level API, though Nakadi marks it deprecated: its offsets are held by the client, so the
cursor of record is the one committed in Delta with the rows, in one commit, and nothing else. The
subscription API holds offsets on the server: a load would have to reset the subscription to the
committed cursors before each read (`PATCH /subscriptions/{id}/cursors`, which also needs the
subscription to have no open stream) and the server's offsets would be a second cursor that can
disagree with Delta's after a crash. Should the low-level API be removed, the subscription API fits
behind this same interface, with that reset as part of `fetch`.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import msgspec
import requests

from .base import BodyReader, FeedProtocol, FetchRequest
from feedapi_dagster.errors import ProtocolError, MalformedResponse
from .models import FIRST, FeedInfo, PageRun, Partition

if TYPE_CHECKING:
    from .client import FeedClient
    from .feed import Feed

BEGIN = "BEGIN"  # Nakadi's offset before the oldest available event
# Seconds. A batch that is not full is sent after BATCH_FLUSH_TIMEOUT (what a caught-up partition
# costs when its newest offset moved since the listing); a stream lasts at most STREAM_TIMEOUT.
BATCH_FLUSH_TIMEOUT = 1
STREAM_TIMEOUT = 60


class Nakadi(FeedProtocol):
    name = "nakadi"
    reports_retention_gaps = True  # old events are deleted whether they were read or not
    event_id_field = "metadata.eid"
    tells_newest_events = True

    def check(self, feed: "Feed") -> None:
        if not feed.event_type:
            raise ValueError("protocol nakadi needs event_type (the Nakadi event type to load)")
        if feed.dialect != "auto" or feed.partition_count is not None or feed.filters is not None:
            raise ValueError("dialect, partition_count and filters are FeedAPI settings, not Nakadi's")

    def discover(self, client: "FeedClient") -> FeedInfo:
        url = f"{_event_type_url(client.feed)}/partitions"
        response = client.get(url, {}, partition=None, what="partition listing")
        with response:
            if response.status_code != 200:
                raise self.status_error(client, response, None, "partition listing")
            try:
                document = response.json()
            except ValueError as error:
                raise ProtocolError(f"feed {client.safe_url}: the partition listing is not JSON") from error
        if not isinstance(document, list):
            raise ProtocolError(f"feed {client.safe_url}: the partition listing is not a list of partitions")
        partitions: list[Partition] = []
        rejected: list[str] = []
        for entry in document:
            try:
                partitions.append(_partition(entry))
            except (ValueError, TypeError, KeyError) as error:
                rejected.append(f"partition entry {str(entry)[:120]} rejected: {error}")
        return FeedInfo(dialect="nakadi", exactly_once=False, partitions=partitions, rejected=rejected)

    def fetch(self, feed: "Feed", info: FeedInfo, partition_id: int, cursor: str) -> FetchRequest:
        offset = BEGIN if cursor == FIRST else cursor
        return FetchRequest(
            f"{_event_type_url(feed)}/events",
            {"batch_limit": str(feed.page_size_hint), "batch_flush_timeout": str(BATCH_FLUSH_TIMEOUT),
             "stream_timeout": str(STREAM_TIMEOUT)},
            {"X-Nakadi-Cursors": json.dumps([{"partition": str(partition_id), "offset": offset}])},
        )

    def reader(self, feed: "Feed", info: FeedInfo, partition_id: int, max_page_bytes: int | None) -> BodyReader:
        return _Stream(partition_id, self.read_end(info, partition_id), max_page_bytes)

    def read_end(self, info: FeedInfo, partition_id: int) -> str | None:
        partition = info.partition(partition_id)
        if partition is None:
            raise ProtocolError(f"partition {partition_id} is not in the partition listing", partition=partition_id)
        return partition.last_cursor or FIRST  # FIRST: nothing was ever published there

    def status_error(self, client: "FeedClient", response: requests.Response, partition: int | None,
                     what: str) -> ProtocolError:
        """Nakadi answers errors with a `Problem` (RFC 7807): its title and detail say what is wrong."""
        try:
            problem = response.json()
        except ValueError:
            problem = None
        if not isinstance(problem, dict) or not (problem.get("title") or problem.get("detail")):
            return super().status_error(client, response, partition, what)
        said = ": ".join(str(problem[key])[:300] for key in ("title", "detail") if problem.get(key))
        return client.status_error(response, partition, what, said)

    def events_behind(self, partition: Partition, cursor: str) -> int | None:
        if partition.last_cursor is None:  # nothing was ever published there
            return 0
        newest = _offset_key(partition.last_cursor)
        if cursor == FIRST:  # every event still held: from the oldest available offset to the newest
            oldest = _offset_key(partition.oldest_available or "")
            return newest[-1] - oldest[-1] + 1 if _same_timeline(newest, oldest) else None
        after = _offset_key(cursor)
        return max(newest[-1] - after[-1], 0) if _same_timeline(newest, after) else None

    def retention_gap(self, partition: Partition | None, cursor: str) -> str | None:
        if partition is None or partition.oldest_available is None or cursor == FIRST:
            return None
        oldest = partition.oldest_available
        after, first = _offset_key(cursor), _offset_key(oldest)
        if len(after) != len(first):
            return None  # offsets of different formats: Nakadi itself answers 422 if the cursor is gone
        # the next event after `cursor` is one past it on the same timeline, or the first of a newer one
        lost = after[:-1] < first[:-1] or (after[:-1] == first[:-1] and after[-1] + 1 < first[-1])
        if not lost:
            return None
        return (f"partition {partition.id}: the events after offset {cursor} and before offset {oldest} "
                f"expired unread (retention): the oldest available offset is {oldest}")


def _event_type_url(feed: "Feed") -> str:
    return f"{feed.url.rstrip('/')}/event-types/{quote(feed.event_type or '', safe='')}"


def _partition(entry: Any) -> Partition:
    if not isinstance(entry, dict):
        raise ValueError("not an object")
    newest, oldest = entry["newest_available_offset"], entry["oldest_available_offset"]
    if not isinstance(newest, str) or not isinstance(oldest, str):
        raise ValueError("offsets must be strings")
    return Partition(id=entry["partition"], last_cursor=None if newest == BEGIN else newest,
                     oldest_available=oldest)


def _same_timeline(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Two offsets whose difference counts events (offsets of two timelines, or unparsed: it does not)."""
    return bool(a) and len(a) == len(b) and a[:-1] == b[:-1]


def _offset_key(offset: str) -> tuple[int, ...]:
    """Nakadi's offsets (`001-0001-000000000000000042`: version, timeline, offset; or a bare number)
    in their order."""
    parts = offset.split("-")
    return tuple(int(part) for part in parts) if all(part.isdigit() for part in parts) else ()


def reached(offset: str, end: str) -> bool:
    if end == FIRST:
        return False
    at, last = _offset_key(offset), _offset_key(end)
    return bool(at) and len(at) == len(last) and at >= last


class _Cursor(msgspec.Struct, gc=False):
    partition: str
    offset: str


class _Batch(msgspec.Struct, gc=False):
    cursor: _Cursor
    events: list[msgspec.Raw] = []


_BATCHES = msgspec.json.Decoder(list[_Batch])
_BATCH = msgspec.json.Decoder(_Batch)


class _Stream(BodyReader):
    """One partition's `EventStreamBatch`es: each block of complete lines is one `PageRun` (a batch a
    page), decoded in one go; the read ends at `end` or at a keep-alive batch."""

    def __init__(self, partition_id: int, end: str | None, max_page_bytes: int | None):
        self.partition_id = partition_id
        self.end = end
        self.max_page_bytes = max_page_bytes
        self.caught_up = False

    def runs(self, chunks: Iterable[bytes]) -> Iterator[PageRun]:
        pending = b""
        for chunk in chunks:
            pending += chunk
            cut = pending.rfind(b"\n")
            if cut < 0:
                self._check_bound(len(pending))
                continue
            block, pending = pending[:cut + 1], pending[cut + 1:]
            run, damage = self._run(block)
            if run is not None:
                yield run
            if self.caught_up:
                return
            if damage is not None:
                raise damage
        if pending.strip():
            raise self._damage("the stream ends in an incomplete line (cut short)")

    def _run(self, block: bytes) -> tuple[PageRun | None, MalformedResponse | None]:
        lines = [line for line in block.split(b"\n") if line.strip()]
        try:
            batches = _BATCHES.decode(b"[" + b",".join(lines) + b"]")
            damage = None
        except (msgspec.DecodeError, UnicodeDecodeError):
            batches, damage = self._good_prefix(lines)
        raws: list[bytes] = []
        ends: list[int] = []
        cursors: list[str] = []
        for batch in batches:
            if batch.cursor.partition != str(self.partition_id):
                raise self._damage(f"a batch of partition {batch.cursor.partition!r} in its stream")
            if not batch.events:  # a keep-alive: nothing more for now
                self.caught_up = True
                break
            raws.extend(map(bytes, batch.events))
            ends.append(len(raws))
            cursors.append(batch.cursor.offset)
            if self.end is not None and reached(batch.cursor.offset, self.end):
                self.caught_up = True
                break
        if self.max_page_bytes is not None and any(map(self.max_page_bytes.__lt__, map(len, lines))):
            raise self._damage(f"a batch of more than {self.max_page_bytes} bytes")
        run = PageRun(self.partition_id, raws, ends, cursors, sum(map(len, raws))) if cursors else None
        return run, damage

    def _good_prefix(self, lines: list[bytes]) -> tuple[list[_Batch], MalformedResponse]:
        """The batches before the first damaged line, and the damage (raised once they are yielded: the
        client then asks again from their cursor)."""
        batches = []
        for line in lines:
            try:
                batches.append(_BATCH.decode(line))
            except (msgspec.DecodeError, UnicodeDecodeError) as error:
                return batches, self._damage(f"a line is not an EventStreamBatch ({error}): {line[:80]!r}")
        raise AssertionError("a block that failed to decode has a line that fails")

    def _check_bound(self, size: int) -> None:
        if self.max_page_bytes is not None and size > self.max_page_bytes:
            raise self._damage(f"a batch of more than {self.max_page_bytes} bytes")

    def _damage(self, reason: str) -> MalformedResponse:
        return MalformedResponse(f"partition {self.partition_id}: {reason}", partition=self.partition_id)
