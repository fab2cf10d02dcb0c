"""Feed protocols, no Spark, no Dagster: the interface a protocol implements (`interface.py`, no
I/O), the one client that speaks HTTP (`client.py`), the open registry (`registry.py`) and the
built-in protocols, one subpackage each (`feedapi/`, `nakadi/`), registered here.

What a protocol of one's own needs is exported here (docs/protocols/adding-a-protocol.md): the
interface (`FeedProtocol`, `Request`, `Response`, `BodyReader`, `JsonDocumentReader` and `RawJson`),
the models (`FeedSettings`, `FeedInfo`, `Partition`, `PageRun`), the first cursor (`FIRST`), the
errors (`refusal_error`, `ProtocolError`, `MalformedResponse`), discovery's shared steps
(`discovery`) and `register_protocol`."""

from feedapi_dagster.errors import MalformedResponse, ProtocolError, RediscoveryNeeded

from . import discovery
from .client import FeedClient
from .feedapi import EventFilter, FeedApi, FeedApiSettings
from .interface import BodyReader, FeedProtocol, Request, Response, refusal_error
from .json_document import JsonDocumentReader, RawJson
from .models import FIRST, FeedInfo, Page, PageRun, Partition
from .nakadi import Nakadi, NakadiSettings
from .registry import feed_settings, protocol_of, register_protocol, registered_protocols
from .retry import RetryPolicy
from .settings import FeedSettings

register_protocol(FeedApi())
register_protocol(Nakadi())

__all__ = [
    "FIRST",
    "BodyReader",
    "EventFilter",
    "FeedApi",
    "FeedApiSettings",
    "FeedClient",
    "FeedInfo",
    "FeedProtocol",
    "FeedSettings",
    "JsonDocumentReader",
    "MalformedResponse",
    "Nakadi",
    "NakadiSettings",
    "Page",
    "PageRun",
    "Partition",
    "ProtocolError",
    "RawJson",
    "RediscoveryNeeded",
    "Request",
    "Response",
    "RetryPolicy",
    "discovery",
    "feed_settings",
    "protocol_of",
    "refusal_error",
    "register_protocol",
    "registered_protocols",
]
