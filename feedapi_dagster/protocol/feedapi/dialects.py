"""The three FeedAPI dialects as small request builders.

A dialect knows how to turn (partition, cursor, page size, filters) into a fetch request and which
key holds an event on the wire; everything else (discovery, paging, parsing) is FeedAPI's
(`protocol.py`), and retries are every protocol's (`FeedClient`).
"""

from __future__ import annotations

from typing import ClassVar

from ..interface import Request
from .settings import Dialect, FeedApiSettings


class DialectSpec:
    name: ClassVar[Dialect]
    event_key: ClassVar[str]

    def fetch(self, feed: FeedApiSettings, partition_id: int, cursor: str, discovery_token: str | None) -> Request:
        raise NotImplementedError


class V1(DialectSpec):
    """ZeroEventHub: no discovery, one `cursor<i>` per call, `n` is the configured partition count."""

    name = "v1"
    event_key = "data"

    def fetch(self, feed, partition_id, cursor, discovery_token):
        params = {
            "n": str(feed.partition_count),
            f"cursor{partition_id}": cursor,
            "pagesizehint": str(feed.page_size_hint),
        }
        return Request(feed.url, params)


class Draft(DialectSpec):
    name = "draft"
    event_key = "event"

    def fetch(self, feed, partition_id, cursor, discovery_token):
        return self._request(feed, partition_id, cursor, "pageSizeHint", str(feed.page_size_hint))

    def stream_fetch(self, feed: FeedApiSettings, partition_id: int, cursor: str, duration_ms: int) -> Request:
        """A fetch kept open `duration_ms` milliseconds: `stream`, which never goes with `pageSizeHint`."""
        return self._request(feed, partition_id, cursor, "stream", str(duration_ms))

    @staticmethod
    def _request(feed: FeedApiSettings, partition_id: int, cursor: str, bound: str, amount: str) -> Request:
        """A fetch bounded by `pageSizeHint` (events) or `stream` (milliseconds): `bound`, with `amount`."""
        params = {"partition": str(partition_id), "cursor": cursor, bound: amount}
        if feed.filters:
            params.update({f"filter-{name}": value for name, value in feed.filters.fields.items()})
        return Request(feed.url, params)


class Published(DialectSpec):
    name = "published"
    event_key = "data"

    def fetch(self, feed, partition_id, cursor, discovery_token):
        params = {
            "token": discovery_token or "",
            "partition": str(partition_id),
            "cursor": cursor,
            "pagesizehint": str(feed.page_size_hint),
        }
        if feed.filters and feed.filters.event_types:
            params["event-types"] = ";".join(feed.filters.event_types)
        if feed.filters and feed.filters.skip_event_types:
            params["skip-event-types"] = ";".join(feed.filters.skip_event_types)
        return Request(feed.url.rstrip("/") + "/events", params)


DRAFT = Draft()  # the only dialect with `stream`
DIALECTS: dict[str, DialectSpec] = {spec.name: spec for spec in (V1(), DRAFT, Published())}
