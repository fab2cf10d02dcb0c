"""Bundled demo servers (pure stdlib) for the demo, the tests and the benchmarks: a FeedAPI feed
(`server.py`, any dialect) and a Nakadi event type (`nakadi.py`)."""
from feedapi_dagster.demo.faults import Faults
from feedapi_dagster.demo.feed import DemoFeed
from feedapi_dagster.demo.nakadi import NakadiDemoServer, NakadiEventType
from feedapi_dagster.demo.server import DemoFeedServer, Gate

__all__ = ["DemoFeed", "DemoFeedServer", "Faults", "Gate", "NakadiDemoServer", "NakadiEventType"]
