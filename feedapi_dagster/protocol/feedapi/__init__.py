"""FeedAPI (v1/ZeroEventHub, the v2 draft, the published v2): the protocol, its settings, dialects,
discovery parsing, NDJSON reader and event filters."""

from .filters import EventFilter
from .protocol import FeedApi
from .settings import Dialect, FeedApiSettings

__all__ = ["Dialect", "EventFilter", "FeedApi", "FeedApiSettings"]
