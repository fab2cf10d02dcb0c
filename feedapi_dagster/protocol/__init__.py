"""FeedAPI protocol, no Spark, no Dagster: discovery, paging, NDJSON (lines decoded in bulk by msgspec),
dialects, retries."""
from .client import FeedClient
from .dialects import EventFilter
from feedapi_dagster.errors import ProtocolError, MalformedResponse, RediscoveryNeeded
from .feed import Feed
from .models import Event, FeedInfo, Page, PageRun, Partition
from .retry import RetryPolicy

__all__ = [
    "Event", "EventFilter", "Feed", "ProtocolError", "FeedClient", "FeedInfo", "MalformedResponse", "Page",
    "PageRun", "Partition", "RediscoveryNeeded", "RetryPolicy",
]
