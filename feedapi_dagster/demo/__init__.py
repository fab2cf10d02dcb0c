"""Bundled demo servers (pure stdlib) for the demo, the tests and the benchmarks: a FeedAPI feed
(`feedapi/`, any dialect) and a Nakadi event type (`nakadi/`). What both share is beside them: HTTP
serving (`http_server.py`), faults (`faults.py`) and the admin endpoint (`admin.py`), the gate a test
holds reads with (`gate.py`), tokens (`tokens.py`) and their console commands' flags (`server_command.py`);
`demo_feeds.py` is the demo command's feed of each protocol."""

from feedapi_dagster.demo.faults import Faults
from feedapi_dagster.demo.feedapi import DemoFeed, DemoFeedServer
from feedapi_dagster.demo.gate import Gate
from feedapi_dagster.demo.nakadi import NakadiDemoServer, NakadiEventType

__all__ = ["DemoFeed", "DemoFeedServer", "Faults", "Gate", "NakadiDemoServer", "NakadiEventType"]
