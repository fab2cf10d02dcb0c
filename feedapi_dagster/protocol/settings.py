"""`FeedSettings`: what every protocol's settings have (where the feed is, its token, TLS, retries).

Each protocol's settings model extends it with its own fields and `protocol: Literal["<name>"]`
(`feedapi.FeedApiSettings`, `nakadi.NakadiSettings`); `registry.feed_settings` validates a feed's
values into the model of the protocol they name. A settings model is the feed's configuration (a
defs.yaml feed, `FeedConfig`, holds one), the `feedapi` Spark data source's options
(`read.datasource` writes and parses its fields as camelCase options) and the arguments of its
`FeedClient`.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from feedapi_dagster.errors import ProtocolError

from .retry import RetryPolicy

# what a bearer token sent in a header may hold: printable ASCII without spaces (RFC 6750's b64token
# and more)
_HEADER_TOKEN = re.compile(r"[\x21-\x7e]+")


class FeedSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    protocol: str
    page_size_hint: int = Field(default=1000, ge=1)
    token_env: str | None = Field(default=None, description="environment variable holding the bearer token")
    token: SecretStr | None = Field(default=None, description='the bearer token itself: "{{ env.X }}" in a defs.yaml')
    ca_bundle: str | None = Field(default=None, description="CA bundle file for TLS verification")
    verify: bool = Field(default=True, description="false turns TLS verification off (never do this in production)")
    # a protocol's model sets its own default (FeedAPI `id`, Nakadi `metadata.eid`)
    event_id_field: str = Field(default="id", description="the payload field stored as event_id, dotted when nested")
    retry: RetryPolicy = Field(default_factory=RetryPolicy)

    @model_validator(mode="after")
    def _one_token(self) -> FeedSettings:
        if self.token is not None and self.token_env is not None:
            raise ValueError("set token or token_env, not both")
        if self.token is not None and not self.token.get_secret_value():
            # read without authentication, in silence, otherwise
            raise ValueError("token is empty: a feed that needs no authentication leaves it out")
        return self

    def __repr__(self) -> str:  # the URL may carry credentials; the token is a SecretStr anyway
        return f"{type(self).__name__}({self.safe_url!r}, protocol={self.protocol!r})"

    @property
    def safe_url(self) -> str:
        """The URL as messages name the feed: without the credentials it may embed."""
        return redact_url(self.url)

    def location(self) -> str:
        """Where the feed is, as descriptions name it: its URL without credentials, and what else a protocol
        needs to pick the feed there (Nakadi's event type)."""
        return self.safe_url

    @property
    def has_token(self) -> bool:
        return self.token is not None or self.token_env is not None

    def bearer_token(self, feed: str | None = None) -> str | None:
        """The token: given, or read from `token_env` in this process (the run's, or an executor's);
        `feed`: how an error names the feed (its URL by default)."""
        if self.token is not None:
            return _header_safe(self.token.get_secret_value(), f"{feed or f'feed {self.safe_url}'}: token")
        if self.token_env is None:
            return None
        token = os.environ.get(self.token_env)
        if not token:
            raise ProtocolError(
                f"{feed or f'feed {self.safe_url}'}: environment variable {self.token_env} "
                "(token_env) is not set where this runs"
            )
        return _header_safe(token, f"{feed or f'feed {self.safe_url}'}: environment variable {self.token_env}")

    def with_token(self, feed: str | None = None) -> FeedSettings:
        """These settings with the token read here, for a read that runs where `token_env` may not be
        set (a cluster's executors): Spark redacts the `token` option from plans and its UI."""
        if self.token_env is None:
            return self
        return self.model_copy(update={"token": SecretStr(self.bearer_token(feed) or ""), "token_env": None})

    def tls_verify(self) -> bool | str:
        """What `requests` takes as `verify`."""
        return self.ca_bundle or self.verify


def _header_safe(token: str, where: str) -> str:
    """`token` if it can be sent in an Authorization header: `requests` refuses whitespace and control
    characters quoting the header, token and all, and `http.client` fails on what Latin-1 lacks."""
    if not _HEADER_TOKEN.fullmatch(token):
        raise ProtocolError(
            f"{where}: the bearer token holds a space, a control character (a newline at the end of "
            "the secret?) or a character outside ASCII; an HTTP header cannot carry it"
        )
    return token


def redact_url(url: str) -> str:
    """The URL without userinfo, so credentials embedded in it never reach logs or errors."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
