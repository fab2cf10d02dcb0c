"""Backoff for transient failures: exponential, full jitter, capped, honouring Retry-After."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from pydantic import BaseModel, ConfigDict, Field

TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})


class RetryPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(default=8, ge=1, description="attempts per request without progress")
    base_delay: float = Field(default=0.2, ge=0)
    max_delay: float = Field(default=20.0, ge=0)
    max_retry_after: float = Field(default=60.0, ge=0, description="cap on a server's Retry-After")

    def delay(self, attempt: int, retry_after: str | None = None, rng: random.Random | None = None) -> float:
        """Seconds to wait before attempt number `attempt + 1` (attempt counts from 1)."""
        server_delay = parse_retry_after(retry_after)
        if server_delay is not None:
            return min(server_delay, self.max_retry_after)
        ceiling = min(self.max_delay, self.base_delay * (2 ** (attempt - 1)))
        return (rng or random).uniform(0, ceiling)


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
