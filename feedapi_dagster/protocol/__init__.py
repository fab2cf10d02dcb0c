"""FeedAPI protocol: pure Python (no Spark, no Dagster). Discovery, paging, NDJSON, dialects, retries."""
from .client import FeedClient
from .dialects import EventFilter
from .errors import FeedAPIError, MalformedResponse, RediscoveryNeeded
from .models import Event, FeedInfo, Page, Partition
from .retry import RetryPolicy

__all__ = [
    "Event", "EventFilter", "FeedAPIError", "FeedClient", "FeedInfo", "MalformedResponse", "Page",
    "Partition", "RediscoveryNeeded", "RetryPolicy",
]
