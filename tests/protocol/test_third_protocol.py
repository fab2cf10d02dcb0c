"""A protocol added from outside the package (`third_protocol.py`, registered by importing it): the
registry accepts its name with its settings, refuses an unknown name listing the registered ones, and
`FeedClient` reads it over real HTTP. Its load through a defs.yaml, the data source and Delta:
tests/orchestration/test_third_protocol.py."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

import pytest
from pydantic import ValidationError

from feedapi_dagster.errors import ProtocolError
from feedapi_dagster.protocol import FeedClient, feed_settings, register_protocol, registered_protocols

from .conftest import ServedFeed, pages_of, payloads
from .third_protocol import JsonLines, JsonLinesSettings


class JsonLinesServer(ServedFeed):
    """The "jsonlines" server of `third_protocol.py` on 127.0.0.1: `events[stream][partition]`."""

    def __init__(self, events: dict[str, dict[int, list[dict]]]):
        self.events = events
        super().__init__()
        self.url = self._server.url.removesuffix("/feed") + "/jsonlines"

    def _handle(self, handler) -> None:
        parts = urlsplit(handler.path)
        query = {key: values[0] for key, values in parse_qs(parts.query).items()}
        stream = self.events.get(query.get("stream", ""))
        path = parts.path.removeprefix("/jsonlines/partitions").strip("/")
        if stream is None:
            status, body = 404, b"no such stream"
        elif not path:
            status, body = (
                200,
                json.dumps({"partitions": [{"id": p, "end": len(e)} for p, e in stream.items()]}).encode(),
            )
        else:
            after, limit = int(query["after"]), int(query["limit"])
            lines = [
                {"offset": offset, "event": event} for offset, event in enumerate(stream[int(path)]) if offset > after
            ][:limit]
            status, body = 200, b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


def events(partitions: int, count: int) -> dict[int, list[dict]]:
    return {p: [{"id": f"{p}-{n}", "n": n} for n in range(count)] for p in range(partitions)}


def test_the_registry_accepts_a_registered_protocol_and_names_the_registered_ones_for_an_unknown_one():
    assert isinstance(registered_protocols()["jsonlines"], JsonLines)
    feed = feed_settings({"url": "http://127.0.0.1:1/x", "protocol": "jsonlines", "stream": "orders"})
    assert isinstance(feed, JsonLinesSettings) and feed.stream == "orders" and feed.event_id_field == "id"
    with pytest.raises(ValidationError, match=r"JsonLinesSettings\nstream\n  Field required"):
        feed_settings(url="http://127.0.0.1:1/x", protocol="jsonlines")
    with pytest.raises(ValidationError, match=r"\nevent_type\n  Extra inputs are not permitted"):
        feed_settings(url="http://127.0.0.1:1/x", protocol="jsonlines", stream="s", event_type="t")
    with pytest.raises(
        ValidationError, match="unknown protocol 'kafka': the registered ones are feedapi, jsonlines, nakadi"
    ):
        feed_settings(url="http://127.0.0.1:1/x", protocol="kafka")
    register_protocol(JsonLines())  # its module imported again: the same protocol, registered again

    class Impostor(JsonLines):
        pass

    with pytest.raises(
        ProtocolError, match="protocol 'jsonlines' is already registered by tests.protocol.third_protocol.JsonLines"
    ):
        register_protocol(Impostor())


def test_feed_client_reads_the_third_protocol_over_http():
    with JsonLinesServer({"orders": events(2, 25)}) as server:
        client = FeedClient(feed_settings(url=server.url, protocol="jsonlines", stream="orders", page_size_hint=10))
        info = client.discover()
        assert info.protocol == "jsonlines" and [p.id for p in info.partitions] == [0, 1]
        pages = pages_of(client, 1)
        assert [event for page in pages for event in payloads(page)] == server.events["orders"][1]
        assert pages[-1].cursor == "24"
        assert pages_of(client, 1, "24") == []  # caught up
        missing = FeedClient(feed_settings(url=server.url, protocol="jsonlines", stream="nope"))
        with pytest.raises(ProtocolError, match="partition listing failed \\(HTTP 404\\): no such stream"):
            missing.discover()
