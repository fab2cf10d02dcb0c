"""`Feed`: one feed, where it is and how to read it.

This one model is the feed's configuration (a defs.yaml feed, `FeedConfig`, extends it), the
`feedapi` Spark data source's options (`lakehouse.datasource` writes and parses it as camelCase
options) and the arguments of its `FeedClient`.
"""
from __future__ import annotations

import os
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator

from .dialects import EventFilter
from feedapi_dagster.errors import ProtocolError
from .models import Dialect
from .registry import PROTOCOLS, ProtocolName, protocol_of
from .retry import RetryPolicy



class Feed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    protocol: ProtocolName = "feedapi"
    dialect: Literal["auto"] | Dialect = Field(default="auto", description="FeedAPI's dialect")
    event_type: str | None = Field(default=None, description="Nakadi: the event type (`url` is Nakadi's base URL)")
    partition_count: int | None = Field(default=None, ge=1, le=32768, description="v1 only: it has no discovery")
    page_size_hint: int = Field(default=1000, ge=1)
    token_env: str | None = Field(default=None, description="environment variable holding the bearer token")
    token: SecretStr | None = Field(default=None, description='the bearer token itself: "{{ env.X }}" in a defs.yaml')
    ca_bundle: str | None = Field(default=None, description="CA bundle file for TLS verification")
    verify: bool = Field(default=True, description="false turns TLS verification off (never do this in production)")
    event_id_field: str = Field(default=None, validate_default=True,  # type: ignore[assignment]
                                description="the payload field stored as event_id, dotted when nested "
                                            "(default: the protocol's: FeedAPI `id`, Nakadi `metadata.eid`)")
    filters: EventFilter | None = None
    retry: RetryPolicy = Field(default_factory=RetryPolicy)

    @field_validator("event_id_field", mode="before")
    @classmethod
    def _default_id_field(cls, value: str | None, info: ValidationInfo) -> str:
        if value is not None:
            return value
        return PROTOCOLS[info.data.get("protocol", "feedapi")].event_id_field

    @model_validator(mode="after")
    def _consistent(self) -> "Feed":
        protocol_of(self).check(self)
        if self.token is not None and self.token_env is not None:
            raise ValueError("set token or token_env, not both")
        if self.token is not None and not self.token.get_secret_value():
            # read without authentication, in silence, otherwise
            raise ValueError("token is empty: a feed that needs no authentication leaves it out")
        return self

    def __repr__(self) -> str:  # the URL may carry credentials; the token is a SecretStr anyway
        return f"{type(self).__name__}({redact_url(self.url)!r}, protocol={self.protocol!r})"

    def bearer_token(self) -> str | None:
        """The token: given, or read from `token_env` in this process (the run's, or an executor's)."""
        if self.token is not None:
            return self.token.get_secret_value()
        if self.token_env is None:
            return None
        token = os.environ.get(self.token_env)
        if not token:
            raise ProtocolError(f"{self.describe()}: environment variable {self.token_env} (token_env) is not set "
                               "where this runs")
        return token

    def with_token(self) -> "Feed":
        """This feed with the token read here, for a read that runs where `token_env` may not be set
        (a cluster's executors): Spark redacts the `token` option from plans and its UI."""
        if self.token_env is None:
            return self
        return self.model_copy(update={"token": SecretStr(self.bearer_token() or ""), "token_env": None})

    def tls_verify(self) -> bool | str:
        """What `requests` takes as `verify`."""
        return self.ca_bundle or self.verify

    def describe(self) -> str:
        return "feed"


def redact_url(url: str) -> str:
    """The URL without userinfo, so credentials embedded in it never reach logs or errors."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
