"""`FeedApiSettings`: a FeedAPI feed's settings, the common ones and FeedAPI's own."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ..settings import FeedSettings
from .filters import EventFilter

Dialect = Literal["v1", "draft", "published"]


class FeedApiSettings(FeedSettings):
    protocol: Literal["feedapi"] = "feedapi"
    dialect: Literal["auto"] | Dialect = Field(default="auto", description="detected by discovery unless set")
    partition_count: int | None = Field(default=None, ge=1, le=32768, description="v1 only: it has no discovery")
    filters: EventFilter | None = None
    stream_ms: int | None = Field(
        default=None,
        ge=1,
        description="read each partition as one `stream` fetch open this many milliseconds, where discovery "
        "offers `stream` (the draft dialect); unset: page with page_size_hint",
    )

    @model_validator(mode="after")
    def _v1_partitions(self) -> FeedApiSettings:
        if self.dialect == "v1" and self.partition_count is None:
            raise ValueError("dialect v1 needs partition_count (v1 has no discovery)")
        return self
