"""The three FeedAPI dialects as small request builders.

A dialect knows how to turn (partition, cursor, page size, filters) into a fetch request and which
key holds an event on the wire; everything else (discovery, paging, parsing) is FeedAPI's
(`feedapi.py`), and retries are every protocol's (`client.py`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .base import FetchRequest
from .models import Dialect

if TYPE_CHECKING:
    from .feed import Feed


class EventFilter(BaseModel):
    """Server-side filters. Draft servers take `filter-<name>=value`; published servers take either
    `event-types` or `skip-event-types` (never both) and may ignore them, so the client re-applies those."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fields: dict[str, str] = Field(default_factory=dict, description="draft: filter-<name>=value")
    event_types: tuple[str, ...] = ()
    skip_event_types: tuple[str, ...] = ()
    event_type_field: str = "type"

    @model_validator(mode="after")
    def _one_type_filter(self) -> "EventFilter":
        if self.event_types and self.skip_event_types:
            raise ValueError("event_types and skip_event_types cannot both be set")
        return self

    def keeps(self, value: object) -> bool:
        """Client-side check of the event-type filter (string payloads have no type and are kept)."""
        if not (self.event_types or self.skip_event_types) or not isinstance(value, dict):
            return True
        event_type = value.get(self.event_type_field)
        if self.event_types:
            return event_type in self.event_types
        return event_type not in self.skip_event_types


class DialectSpec:
    name: ClassVar[Dialect]
    event_key: ClassVar[str]

    def fetch(self, feed: "Feed", partition_id: int, cursor: str, discovery_token: str | None) -> FetchRequest:
        raise NotImplementedError


class V1(DialectSpec):
    """ZeroEventHub: no discovery, one `cursor<i>` per call, `n` is the configured partition count."""

    name = "v1"
    event_key = "data"

    def fetch(self, feed, partition_id, cursor, discovery_token):
        params = {"n": str(feed.partition_count), f"cursor{partition_id}": cursor,
                  "pagesizehint": str(feed.page_size_hint)}
        return FetchRequest(feed.url, params)


class Draft(DialectSpec):
    name = "draft"
    event_key = "event"

    def fetch(self, feed, partition_id, cursor, discovery_token):
        params = {"partition": str(partition_id), "cursor": cursor, "pageSizeHint": str(feed.page_size_hint)}
        if feed.filters:
            params.update({f"filter-{name}": value for name, value in feed.filters.fields.items()})
        return FetchRequest(feed.url, params)


class Published(DialectSpec):
    name = "published"
    event_key = "data"

    def fetch(self, feed, partition_id, cursor, discovery_token):
        params = {"token": discovery_token or "", "partition": str(partition_id), "cursor": cursor,
                  "pagesizehint": str(feed.page_size_hint)}
        if feed.filters and feed.filters.event_types:
            params["event-types"] = ";".join(feed.filters.event_types)
        if feed.filters and feed.filters.skip_event_types:
            params["skip-event-types"] = ";".join(feed.filters.skip_event_types)
        return FetchRequest(feed.url.rstrip("/") + "/events", params)


DIALECTS: dict[str, DialectSpec] = {spec.name: spec for spec in (V1(), Draft(), Published())}
