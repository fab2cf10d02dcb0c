"""The demo command's feed of each protocol: the feed settings (a `FeedConfig`'s) that read it on
127.0.0.1, and the bundled server that serves it."""

from __future__ import annotations

from feedapi_dagster.demo.feedapi import DemoFeed, DemoFeedServer
from feedapi_dagster.demo.nakadi import NakadiDemoServer, NakadiEventType

DEMO_EVENT_TYPE = "demo.orders"


def demo_feed_settings(protocol: str, port: int) -> dict[str, str]:
    """The feed settings of the demo feed of `protocol` served on 127.0.0.1:`port`."""
    if protocol == "nakadi":
        return {"protocol": "nakadi", "url": f"http://127.0.0.1:{port}", "event_type": DEMO_EVENT_TYPE}
    return {"url": f"http://127.0.0.1:{port}/feed"}


def demo_server(protocol: str, port: int, events: int, partitions: int) -> DemoFeedServer | NakadiDemoServer:
    """The bundled server of `protocol` with a generated feed (not started). Nakadi's repeats a few
    events, as Nakadi may: the demo shows them deduplicated."""
    if protocol == "nakadi":
        return NakadiDemoServer(
            NakadiEventType(DEMO_EVENT_TYPE, partitions=partitions, events=events, duplicate_ratio=0.02), port=port
        )
    return DemoFeedServer(DemoFeed(partitions=partitions, events=events), dialect="published", port=port)
