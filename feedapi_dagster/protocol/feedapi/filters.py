"""`EventFilter`: FeedAPI's event filters, sent to the server and, for the published dialect, applied
again by the client."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EventFilter(BaseModel):
    """Server-side filters. Draft servers take `filter-<name>=value`; published servers take either
    `event-types` or `skip-event-types` (never both) and may ignore them, so the client re-applies those."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fields: dict[str, str] = Field(default_factory=dict, description="draft: filter-<name>=value")
    event_types: tuple[str, ...] = ()
    skip_event_types: tuple[str, ...] = ()
    event_type_field: str = "type"

    @model_validator(mode="after")
    def _one_type_filter(self) -> EventFilter:
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
