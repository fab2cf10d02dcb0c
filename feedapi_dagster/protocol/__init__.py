"""Feed protocols, no Spark, no Dagster: the interface a protocol implements (`interface.py`, no
I/O), the one client that speaks HTTP (`client.py`), the open registry (`registry.py`) and the
built-in protocols, one subpackage each (`feedapi/`, `nakadi/`), registered here."""

from feedapi_dagster.errors import MalformedResponse, ProtocolError, RediscoveryNeeded

from .client import FeedClient
from .feedapi import EventFilter, FeedApi, FeedApiSettings
from .interface import BodyReader, FeedProtocol, Request, Response
from .models import FeedInfo, Page, PageRun, Partition
from .nakadi import Nakadi, NakadiSettings
from .registry import feed_settings, protocol_of, register_protocol, registered_protocols
from .retry import RetryPolicy
from .settings import FeedSettings

register_protocol(FeedApi())
register_protocol(Nakadi())

__all__ = [
    "BodyReader",
    "EventFilter",
    "FeedApi",
    "FeedApiSettings",
    "FeedClient",
    "FeedInfo",
    "FeedProtocol",
    "FeedSettings",
    "MalformedResponse",
    "Nakadi",
    "NakadiSettings",
    "Page",
    "PageRun",
    "Partition",
    "ProtocolError",
    "RediscoveryNeeded",
    "Request",
    "Response",
    "RetryPolicy",
    "feed_settings",
    "protocol_of",
    "register_protocol",
    "registered_protocols",
]
