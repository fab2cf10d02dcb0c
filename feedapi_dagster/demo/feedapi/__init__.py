"""The bundled FeedAPI demo server: its feed model (`demo_feed.py`), the fetch it answers (`fetch.py`),
the server (`server.py`: discovery and pages per dialect), its HTTP handler, admin actions and command."""

from feedapi_dagster.demo.feedapi.demo_feed import DemoFeed
from feedapi_dagster.demo.feedapi.server import DemoFeedServer

__all__ = ["DemoFeed", "DemoFeedServer"]
