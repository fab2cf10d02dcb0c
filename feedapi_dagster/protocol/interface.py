"""`FeedProtocol`: what one protocol knows, behind one small interface, without I/O.

`FeedClient` does the HTTP (one session, retries, backoff, the bearer token) and the paging loop
(resume from the last good cursor after a cut-short body, stop where the protocol says the read
ends); a protocol builds requests (`Request`) and reads what came back (`Response`, a response
body's chunks): where the partitions are, how to ask for the events after a cursor, how to read a
body into `PageRun`s, what a refused response means. It never holds the client nor a connection, as
dlt's paginators receive a response and never the client. Everything above the protocol layer (the
data source, the loader, the Delta commit, Dagster) sees `FeedInfo`, `Partition` and `PageRun` only.

Adding a protocol: a module with a `FeedProtocol` subclass and its settings model (a `FeedSettings`
subclass whose `protocol` is `Literal["<name>"]`), registered with `registry.register_protocol`
when the module is imported (docs/protocols/adding-a-protocol.md).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from feedapi_dagster.errors import ProtocolError

from .models import FeedInfo, PageRun, Partition
from .settings import FeedSettings

Settings = TypeVar("Settings", bound=FeedSettings)


@dataclass(frozen=True)
class Request:
    """A GET the client sends for a protocol."""

    url: str
    params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Response:
    """A response as a protocol sees it: a discovery answer, or a refused request (the client reads a
    refused body's first bytes). The client has already taken the bearer token out of `body`."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body's JSON; ValueError when it is not JSON."""
        return json.loads(self.body)


class BodyReader(ABC):
    """Reads one response body into the `PageRun`s of one partition. The client asks the protocol
    for a new one for each attempt of a fetch (`FeedProtocol.reader`, with the cursor that attempt
    reads after), so a reader's state is that of one body: what it carries between chunks, and
    `caught_up`, which it sets when the body said the partition has nothing more now (the client then
    asks no further)."""

    caught_up: bool = False

    @abstractmethod
    def runs(self, chunks: Iterable[bytes]) -> Iterator[PageRun]:
        """The runs of the body `chunks` (its bytes as they arrive, cut anywhere): each as soon as the
        bytes that complete it have come, so that a body cut short later loses none of them. Raises
        `MalformedResponse` for a body that is not the protocol's (the client retries from the last
        run's cursor)."""
        raise NotImplementedError


class FeedProtocol(ABC, Generic[Settings]):
    """One protocol. `settings` is its settings model: the configuration accepts `protocol: <name>`
    with that model's fields once the protocol is registered. A subclass that lacks one of the abstract
    methods cannot be made; one whose method takes other parameters than these is refused when it is
    registered (`registry.register_protocol`), not in a Spark worker at its first call."""

    name: ClassVar[str]
    settings: ClassVar[type[FeedSettings]]
    # discovery says where each partition's newest event is (`events_behind` answers)
    tells_newest_events: ClassVar[bool] = False
    # whether the server deletes events on its own (retention) and says which are gone
    # (`retention_gap`): the feed's asset then has a check of events that expired unread
    reports_retention_gaps: ClassVar[bool] = False

    @abstractmethod
    def discovery_request(self, feed: Settings) -> Request | None:
        """The request whose answer says the feed's partitions; None: there is none to send (the
        settings say them, as FeedAPI v1's `partition_count`)."""
        raise NotImplementedError

    @abstractmethod
    def discovered(self, feed: Settings, response: Response | None) -> FeedInfo:
        """The partitions, from the answer to `discovery_request` (None when there was none); raises
        `ProtocolError` for a refused or unreadable answer (`refusal`, `discovery.document`)."""
        raise NotImplementedError

    def schema_request(self, feed: Settings) -> Request | None:
        """The request whose answer declares the types of the payloads' top-level fields (Nakadi's
        event type, with its JSON Schema); None: the server declares none (they are inferred)."""
        return None

    def declared_columns(self, feed: Settings, response: Response) -> dict[str, str]:
        """The payloads' top-level fields the answer to `schema_request` declares, each as a Spark SQL
        DDL type (`{"amount": "DOUBLE", "items": "ARRAY<STRUCT<sku: STRING>>"}`), keyed by the field's
        name as the payloads carry it; a field it cannot type exactly is left out. Raises
        `ProtocolError` for a refused or unreadable answer (`refusal`)."""
        return {}

    @abstractmethod
    def fetch(self, feed: Settings, info: FeedInfo, partition_id: int, cursor: str) -> Request:
        """The request for the events of `partition_id` after `cursor`."""
        raise NotImplementedError

    def stream_ms(self, feed: Settings, info: FeedInfo) -> int | None:
        """How long a read of one partition keeps one fetch open (`stream_fetch`), in milliseconds; None:
        it pages (`fetch`). Only where the settings ask for it and the server offers it."""
        return None

    def stream_fetch(self, feed: Settings, info: FeedInfo, partition_id: int, cursor: str, duration_ms: int) -> Request:
        """The request for the events of `partition_id` after `cursor`, and those published during the
        next `duration_ms` milliseconds, in one response (where `stream_ms` is not None)."""
        raise NotImplementedError

    @abstractmethod
    def reader(
        self, feed: Settings, info: FeedInfo, partition_id: int, cursor: str, max_page_bytes: int | None
    ) -> BodyReader:
        """A reader of one answer to the fetch of `partition_id` after `cursor` (`FIRST`: from the start),
        made anew for each attempt; `max_page_bytes`: the most payload bytes a page may hold (None: no
        bound), beyond which the body is malformed."""
        raise NotImplementedError

    def read_end(self, info: FeedInfo, partition_id: int) -> str | None:
        """The cursor at which a read of the partition stops (None: when the server says it is caught
        up); raises `ProtocolError` for a partition the protocol cannot read."""
        return None

    def refusal(self, feed: Settings, response: Response, partition: int | None, what: str) -> ProtocolError:
        """The error for a response that is neither a success nor transient: the server's body, by
        default (a protocol whose errors say more in a structure reads it)."""
        return refusal_error(feed, response, partition, what, response.text[:500].strip())

    def events_behind(self, partition: Partition, cursor: str) -> int | None:
        """How many events the server holds after `cursor` in `partition`, as discovery says (Nakadi's
        newest offset); None where it cannot tell (`tells_newest_events`: FeedAPI never can)."""
        return None

    def retention_gap(self, partition: Partition | None, cursor: str) -> str | None:
        """What was lost when the server no longer holds the events right after `cursor` (its
        retention removed them unread), or None."""
        return None


def refusal_error(
    feed: FeedSettings, response: Response, partition: int | None, what: str, explanation: str
) -> ProtocolError:
    """The error of a refused request, quoting the server's `explanation`."""
    status = response.status
    where = f"feed {feed.safe_url}" + (f" partition {partition}" if partition is not None else "")
    if status in (401, 403):
        hint = "the token was refused" if feed.has_token else "the server wants a bearer token"
        return ProtocolError(
            f"{where}: {what} not authorized (HTTP {status}): {hint}: {explanation}", status=status, partition=partition
        )
    return ProtocolError(f"{where}: {what} failed (HTTP {status}): {explanation}", status=status, partition=partition)
