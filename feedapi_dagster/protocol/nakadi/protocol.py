"""Nakadi event types as a `FeedProtocol`, through Nakadi's low-level API.

An event type is a feed: `GET /event-types/{name}/partitions` lists its partitions (one that a
repartitioning adds is a new partition, read from `BEGIN`), and `GET /event-types/{name}/events`
with `X-Nakadi-Cursors` streams one partition after an offset as NDJSON `EventStreamBatch`es, each a
page: its events and the offset of its last one, the cursor. The stream asks for `batch_limit =
pageSizeHint` events a batch and ends after `STREAM_TIMEOUT` seconds (then the client asks again
from its cursor); the read stops at the newest offset the partition listing gave, or at a keep-alive
batch (a cursor without events: the partition is caught up), whichever comes first. Events are kept
as the JSON Nakadi sent; their id is `metadata.eid`, and since Nakadi delivers at least once, loads
deduplicate by it. `GET /event-types/{name}` answers the event type, whose JSON Schema declares the
types of the events' top-level fields (`json_schema.py`).

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
from typing import Any
from urllib.parse import quote

from feedapi_dagster.errors import ProtocolError

from .. import discovery
from ..interface import BodyReader, FeedProtocol, Request, Response, refusal_error
from ..models import FIRST, FeedInfo, Partition
from .json_schema import event_type_columns
from .offsets import BEGIN, offset_key, same_timeline
from .settings import NakadiSettings
from .stream import EventStream

# Seconds. A batch that is not full is sent after BATCH_FLUSH_TIMEOUT (what a caught-up partition
# costs when its newest offset moved since the listing); a stream lasts at most STREAM_TIMEOUT.
BATCH_FLUSH_TIMEOUT = 1
STREAM_TIMEOUT = 60


class Nakadi(FeedProtocol[NakadiSettings]):
    name = "nakadi"
    settings = NakadiSettings
    reports_retention_gaps = True  # old events are deleted whether they were read or not
    tells_newest_events = True

    def discovery_request(self, feed: NakadiSettings) -> Request:
        return Request(f"{_event_type_url(feed)}/partitions")

    def discovered(self, feed: NakadiSettings, response: Response | None) -> FeedInfo:
        assert response is not None  # there is always a partition listing to ask for
        document = discovery.document(self, feed, response, "partition listing")
        if not isinstance(document, list):
            raise ProtocolError(f"feed {feed.safe_url}: the partition listing is not a list of partitions")
        partitions, rejected = discovery.partitions(feed, document, _partition)
        return FeedInfo(protocol=feed.protocol, exactly_once=False, partitions=partitions, rejected=rejected)

    def schema_request(self, feed: NakadiSettings) -> Request:
        return Request(_event_type_url(feed))

    def declared_columns(self, feed: NakadiSettings, response: Response) -> dict[str, str]:
        """The columns the event type's JSON Schema types exactly (`json_schema.event_type_columns`)."""
        if response.status == 404:
            said = _problem_text(response) or response.text[:500].strip()
            raise ProtocolError(
                f"feed {feed.safe_url}: event type {feed.event_type!r} not found (HTTP 404): {said}", status=404
            )
        document = discovery.document(self, feed, response, "event type lookup")
        try:
            return event_type_columns(document)
        except ValueError as error:
            raise ProtocolError(f"feed {feed.safe_url}: event type {feed.event_type!r}: {error}") from None

    def fetch(self, feed: NakadiSettings, info: FeedInfo, partition_id: int, cursor: str) -> Request:
        offset = BEGIN if cursor == FIRST else cursor
        return Request(
            f"{_event_type_url(feed)}/events",
            {
                "batch_limit": str(feed.page_size_hint),
                "batch_flush_timeout": str(BATCH_FLUSH_TIMEOUT),
                "stream_timeout": str(STREAM_TIMEOUT),
            },
            {"X-Nakadi-Cursors": json.dumps([{"partition": str(partition_id), "offset": offset}])},
        )

    def reader(
        self, feed: NakadiSettings, info: FeedInfo, partition_id: int, cursor: str, max_page_bytes: int | None
    ) -> BodyReader:
        return EventStream(partition_id, self.read_end(info, partition_id), max_page_bytes)

    def read_end(self, info: FeedInfo, partition_id: int) -> str | None:
        partition = info.partition(partition_id)
        if partition is None:
            raise ProtocolError(f"partition {partition_id} is not in the partition listing", partition=partition_id)
        return partition.last_cursor or FIRST  # FIRST: nothing was ever published there

    def refusal(self, feed: NakadiSettings, response: Response, partition: int | None, what: str) -> ProtocolError:
        """Nakadi answers errors with a `Problem` (RFC 7807): its title and detail say what is wrong."""
        said = _problem_text(response)
        if said is None:
            return super().refusal(feed, response, partition, what)
        return refusal_error(feed, response, partition, what, said)

    def events_behind(self, partition: Partition, cursor: str) -> int | None:
        if partition.last_cursor is None:  # nothing was ever published there
            return 0
        newest = offset_key(partition.last_cursor)
        if cursor == FIRST:  # every event still held: from the oldest available offset to the newest
            oldest = offset_key(partition.oldest_available or "")
            return newest[-1] - oldest[-1] + 1 if same_timeline(newest, oldest) else None
        after = offset_key(cursor)
        return max(newest[-1] - after[-1], 0) if same_timeline(newest, after) else None

    def retention_gap(self, partition: Partition | None, cursor: str) -> str | None:
        if partition is None or partition.oldest_available is None or cursor == FIRST:
            return None
        oldest = partition.oldest_available
        after, first = offset_key(cursor), offset_key(oldest)
        if len(after) != len(first):
            return None  # offsets of different formats: Nakadi itself answers 422 if the cursor is gone
        # the next event after `cursor` is one past it on the same timeline, or the first of a newer one
        lost = after[:-1] < first[:-1] or (after[:-1] == first[:-1] and after[-1] + 1 < first[-1])
        if not lost:
            return None
        return (
            f"partition {partition.id}: the events after offset {cursor} and before offset {oldest} "
            f"expired unread (retention): the oldest available offset is {oldest}"
        )


def _event_type_url(feed: NakadiSettings) -> str:
    return f"{feed.url.rstrip('/')}/event-types/{quote(feed.event_type, safe='')}"


def _problem_text(response: Response) -> str | None:
    """The title and detail of the `Problem` (RFC 7807) `response` holds, or None."""
    try:
        problem = response.json()
    except ValueError:
        return None
    if not isinstance(problem, dict) or not (problem.get("title") or problem.get("detail")):
        return None
    return ": ".join(str(problem[key])[:300] for key in ("title", "detail") if problem.get(key))


def _partition(entry: Any) -> Partition:
    if not isinstance(entry, dict):
        raise ValueError("not an object")
    newest, oldest = entry["newest_available_offset"], entry["oldest_available_offset"]
    if not isinstance(newest, str) or not isinstance(oldest, str):
        raise ValueError("offsets must be strings")
    return Partition(id=entry["partition"], last_cursor=None if newest == BEGIN else newest, oldest_available=oldest)
