"""The protocols a feed can speak (`Feed.protocol`): one entry per `FeedProtocol` module."""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from .base import FeedProtocol
from .feedapi import FeedApi
from .nakadi import Nakadi

if TYPE_CHECKING:
    from .feed import Feed

ProtocolName = Literal["feedapi", "nakadi"]  # the keys of PROTOCOLS, for the configuration's schema

PROTOCOLS: dict[str, FeedProtocol] = {protocol.name: protocol for protocol in (FeedApi(), Nakadi())}


def protocol_of(feed: "Feed") -> FeedProtocol:
    return PROTOCOLS[feed.protocol]
