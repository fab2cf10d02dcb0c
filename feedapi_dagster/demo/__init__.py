"""A bundled FeedAPI server (pure stdlib) for the demo, the tests and the benchmarks."""
from feedapi_dagster.demo.faults import Faults
from feedapi_dagster.demo.feed import DemoFeed
from feedapi_dagster.demo.server import DemoFeedServer, Gate

__all__ = ["DemoFeed", "DemoFeedServer", "Faults", "Gate"]
