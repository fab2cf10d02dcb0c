"""The protocols a feed can speak (`Feed.protocol`): one entry per `FeedProtocol` module."""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from .base import FeedProtocol
from .feedapi import FeedApi
from .nakadi import Nakadi

if TYPE_CHECKING:
    from .feed import Feed

PROTOCOLS: dict[str, FeedProtocol] = {protocol.name: protocol for protocol in (FeedApi(), Nakadi())}

# `Feed.protocol`'s type: the registered names, so that a configuration's schema (and `dg check defs`)
# lists them and names a misspelt one
ProtocolName = Literal[tuple(PROTOCOLS)]  # type: ignore[valid-type]


def protocol_of(feed: "Feed") -> FeedProtocol:
    return PROTOCOLS[feed.protocol]
