"""`FeedProtocol`: what one protocol knows, behind one small interface.

`FeedClient` does the HTTP (one session, retries, backoff, the bearer token) and the paging loop
(resume from the last good cursor after a cut-short body, stop where the protocol says the read
ends); a protocol says where the partitions are, how to ask for the events after a cursor, how to
read a response body into `PageRun`s and what an error status means. Everything above the protocol
layer (the data source, the loader, the Delta commit, Dagster) sees `FeedInfo`, `Partition` and
`PageRun` only, never a protocol.

Adding a protocol: one module in `protocol/` with a `FeedProtocol` subclass, and its entry in
`protocol.registry.PROTOCOLS`.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import requests

from feedapi_dagster.errors import ProtocolError
from .models import FeedInfo, PageRun, Partition

if TYPE_CHECKING:
    from .client import FeedClient
    from .feed import Feed


@dataclass(frozen=True)
class FetchRequest:
    url: str
    params: dict[str, str]
    headers: dict[str, str] = field(default_factory=dict)


class BodyReader:
    """Reads one response body into the `PageRun`s of one partition. `caught_up` is set when the
    body said the partition has nothing more now (the client then asks no further)."""

    caught_up: bool = False

    def runs(self, chunks: Iterable[bytes]) -> Iterator[PageRun]:
        raise NotImplementedError


class FeedProtocol:
    name: ClassVar[str]
    # the payload field that identifies an event (dotted for a nested one), unless the feed says
    event_id_field: ClassVar[str]
    # discovery says where each partition's newest event is (`events_behind` answers)
    tells_newest_events: ClassVar[bool] = False
    # whether the server deletes events on its own (retention) and says which are gone
    # (`retention_gap`): the feed's asset then has a check of events that expired unread
    reports_retention_gaps: ClassVar[bool] = False

    def check(self, feed: "Feed") -> None:
        """Raise ValueError when `feed`'s settings make no sense for this protocol."""

    def discover(self, client: "FeedClient") -> FeedInfo:
        raise NotImplementedError

    def fetch(self, feed: "Feed", info: FeedInfo, partition_id: int, cursor: str) -> FetchRequest:
        """The request for the events of `partition_id` after `cursor`."""
        raise NotImplementedError

    def reader(self, feed: "Feed", info: FeedInfo, partition_id: int, max_page_bytes: int | None) -> BodyReader:
        raise NotImplementedError

    def read_end(self, info: FeedInfo, partition_id: int) -> str | None:
        """The cursor at which a read of the partition stops (None: when the server says it is caught
        up); raises `ProtocolError` for a partition the protocol cannot read."""
        return None

    def status_error(self, client: "FeedClient", response: requests.Response, partition: int | None,
                     what: str) -> ProtocolError:
        """The error for a response that is neither a success nor transient (never quoting the token)."""
        return client.status_error(response, partition, what, response.text[:500].strip())

    def events_behind(self, partition: Partition, cursor: str) -> int | None:
        """How many events the server holds after `cursor` in `partition`, as discovery says (Nakadi's
        newest offset); None where it cannot tell (`tells_newest_events`: FeedAPI never can)."""
        return None

    def retention_gap(self, partition: Partition | None, cursor: str) -> str | None:
        """What was lost when the server no longer holds the events right after `cursor` (its
        retention removed them unread), or None."""
        return None
