"""Bad input on the wire: clear errors naming the feed and partition, bounded memory, timeouts."""

import json
import time

import pytest

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.protocol import FeedClient, ProtocolError, RetryPolicy, feed_settings

from .conftest import LocalServer, pages_of

NO_WAIT = RetryPolicy(max_attempts=2, base_delay=0)


def streaming_server(body) -> LocalServer:
    """Answers discovery with one partition, then fetches with `body(handler)`."""

    def handle(handler):
        if "partition=" in handler.path:
            return body(handler)
        payload = json.dumps({"partitions": [{"id": "0"}]}).encode()
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    return LocalServer(handle)


@pytest.fixture
def streaming():
    servers = []
    yield lambda body: servers.append(streaming_server(body)) or servers[-1]
    for server in servers:
        server.close()


def test_an_endless_body_is_cut_at_the_page_bound(streaming):
    def endless(handler):
        handler.send_response(200)
        handler.end_headers()  # no length: the body ends when the connection does, i.e. never
        line = b'{"event":"' + b"z" * 10_000 + b'"}\n'
        try:
            while True:
                handler.wfile.write(line)
        except OSError:
            pass

    server = streaming(endless)
    client = FeedClient(feed_settings(url=server.url, retry=NO_WAIT), max_page_bytes=2_000_000)
    with pytest.raises(ProtocolError, match=r"partition 0: .*more than 2000000 bytes of events without a checkpoint"):
        pages_of(client, 0)


def test_a_server_that_hangs_times_out(streaming):
    def hang(handler):
        time.sleep(3)

    server = streaming(hang)
    client = FeedClient(feed_settings(url=server.url, retry=NO_WAIT), timeout=(1.0, 0.3))
    started = time.monotonic()
    with pytest.raises(ProtocolError, match=r"partition 0: giving up after 2 attempts: .*(Timeout|timed out)"):
        pages_of(client, 0)
    assert time.monotonic() - started < 3


@pytest.mark.parametrize(
    "body, reason",
    [
        (b'{"event":1}\n\xc3\x28 not utf-8\n{"cursor":"c1"}\n', "not valid UTF-8"),
        (b'{"event":1}\nthis is not json\n{"cursor":"c1"}\n', "not a FeedAPI JSON object"),
    ],
)
def test_bad_lines_fail_clearly_after_retries(streaming, body, reason):
    def send(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    server = streaming(send)
    with pytest.raises(
        ProtocolError, match=f"feed http://127.0.0.1:.*partition 0: giving up after 2 attempts: .*{reason}"
    ):
        pages_of(FeedClient(feed_settings(url=server.url, retry=NO_WAIT)), 0)


def test_a_50_megabyte_event_is_read_whole():
    feed = DemoFeed(partitions=1, events=2, seed=1)
    big = '{"id":"huge","blob":"' + "x" * (50 * 1024 * 1024) + '"}'
    feed.add_event(big, partition=0)
    with DemoFeedServer(feed, dialect="draft") as server:
        pages = pages_of(FeedClient(feed_settings(url=server.url)), 0)
    raws = [raw for page in pages for raw in page.raw_events]
    assert len(raws) == 3 and raws[-1] == big.encode()


def test_an_unreachable_feed_says_why_whole() -> None:
    """The reason of a refused connection is what the message ends with, not cut off after the URL."""
    from tests.ports import find_free_port

    closed = f"http://127.0.0.1:{find_free_port()}/feed"
    client = FeedClient(feed_settings(url=closed, retry=NO_WAIT))
    with pytest.raises(ProtocolError) as raised:
        client.discover()
    message = str(raised.value)
    assert message.endswith("Failed to establish a new connection: [Errno 111] Connection refused"), message
    assert "Max retries exceeded" not in message, message
