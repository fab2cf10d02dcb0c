"""`NakadiSettings`: a Nakadi event type's settings, the common ones and Nakadi's own."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..settings import FeedSettings


class NakadiSettings(FeedSettings):
    """`url` is Nakadi's base URL; `event_type` the event type to load."""

    protocol: Literal["nakadi"] = "nakadi"
    event_type: str = Field(min_length=1, description="the Nakadi event type to load")
    event_id_field: str = Field(
        default="metadata.eid", description="the payload field stored as event_id, dotted when nested"
    )

    def location(self) -> str:
        return f"{self.safe_url}, event type {self.event_type}"
