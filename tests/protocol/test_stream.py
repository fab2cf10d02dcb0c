"""FeedAPI's `stream` mode, the client against the bundled server over real HTTP on 127.0.0.1: events
published during an open stream, its duration, cut streams, an API gateway closing long requests, a
feed without the flag, and a slow body whose first lines are handed on before it ends."""

from __future__ import annotations

import gzip
import logging
import threading
import time
from urllib.parse import parse_qs

import pytest

from feedapi_dagster.demo import DemoFeed, DemoFeedServer, Faults
from feedapi_dagster.demo.feedapi.fetch import Fetch
from feedapi_dagster.protocol import FeedClient, RetryPolicy, feed_settings

from .conftest import LocalServer, texts
from .gateway import Gateway

FAST_RETRY = RetryPolicy(max_attempts=8, base_delay=0.01, max_delay=0.05)


class CountingServer(DemoFeedServer):
    """The demo server, recording the query of every fetch it is sent."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fetches: list[dict[str, list[str]]] = []

    def parse_fetch(self, query: str) -> Fetch:
        self.fetches.append(parse_qs(query))
        return super().parse_fetch(query)


def stream_client(url: str, stream_ms: int | None, **kwargs) -> FeedClient:
    return FeedClient(feed_settings(url=url, stream_ms=stream_ms, retry=FAST_RETRY), **kwargs)


def publish_during(feed: DemoFeed, seconds: float, every: float = 0.1) -> threading.Thread:
    """Append a few events every `every` s for `seconds`, on a thread (started)."""

    def publish() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(every)
            feed.append(3, partition=0)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    return thread


def read_texts(client: FeedClient, partition: int = 0, cursor: str = "_first") -> list[str]:
    return [text for run in client.page_runs(partition, cursor) for page in run.pages() for text in texts(page)]


def test_discovery_flag_only_where_the_draft_server_offers_it() -> None:
    feed = DemoFeed(partitions=1, events=5)
    for dialect, stream, offered in [("draft", True, True), ("draft", False, False), ("published", True, False)]:
        with DemoFeedServer(feed, dialect=dialect, stream=stream) as server:
            with FeedClient(feed_settings(url=server.url)) as client:
                assert client.discover().stream is offered, (dialect, stream)
    with DemoFeedServer(feed, dialect="v1") as server:
        with FeedClient(feed_settings(url=server.url, dialect="v1", partition_count=1)) as client:
            assert client.discover().stream is False


def test_events_published_during_a_stream_arrive_on_it_promptly_until_its_end() -> None:
    feed = DemoFeed(partitions=1, events=20)
    with CountingServer(feed) as server, stream_client(server.url, 2000) as client:
        client.discover()
        published: dict[str, float] = {}

        def publish_late() -> None:
            for number in range(3):
                time.sleep(0.4)
                published[f"late-{number}"] = time.monotonic()
                feed.add_event(f'{{"id":"late-{number}"}}', partition=0)

        threading.Thread(target=publish_late, daemon=True).start()
        started = time.monotonic()
        arrived: dict[str, float] = {}
        events: list[str] = []
        for run in client.page_runs(0):
            now = time.monotonic()
            for page in run.pages():
                for text in texts(page):
                    events.append(text)
                    if "late-" in text:
                        arrived[text[7:13]] = now
        took = time.monotonic() - started
    assert events == feed.published(0)
    assert sorted(arrived) == ["late-0", "late-1", "late-2"]
    assert all(arrived[name] - published[name] < 1.0 for name in arrived), (arrived, published)
    assert 2.0 <= took < 3.0  # the stream's duration, honoured
    assert len(server.fetches) == 1  # one request: the late events came on the open stream
    assert server.fetches[0]["stream"] == ["2000"] and "pageSizeHint" not in server.fetches[0]


def test_the_stream_of_a_partition_closed_under_it_ends_once_drained() -> None:
    feed = DemoFeed(partitions=2, events=40)
    with CountingServer(feed) as server, stream_client(server.url, 5000) as client:
        threading.Timer(0.3, feed.close, args=(0,)).start()
        started = time.monotonic()
        events = read_texts(client)
        took = time.monotonic() - started
    assert events == feed.published(0)
    assert took < 2.0 and len(server.fetches) == 2  # the server's end, then nothing new: no spinning


def test_a_quiet_stream_outlives_the_read_timeout() -> None:
    """The read timeout of a stream is its duration plus the client's: a stream quiet for longer than
    the client's read timeout (here no line for 1 s, the demo server's keep-alive) is healthy."""
    feed = DemoFeed(partitions=1, events=3)
    with CountingServer(feed) as server, stream_client(server.url, 1500, timeout=(5.0, 0.3)) as client:
        assert len(read_texts(client)) == 3
    assert len(server.fetches) == 1


@pytest.mark.parametrize("kinds", [("truncated",), ("junk",), ("truncated", "junk", "reset", "503")])
def test_a_cut_stream_resumes_from_the_last_good_cursor(kinds: tuple[str, ...]) -> None:
    feed = DemoFeed(partitions=1, events=300)
    faults = Faults(0.5, seed=3, retry_after=0, kinds=kinds)
    with CountingServer(feed, faults=faults) as server, stream_client(server.url, 2000) as client:
        publisher = publish_during(feed, 1.5)
        events = read_texts(client)
        publisher.join()
    assert sum(server.counted_faults().values()) >= 1 and len(server.fetches) > 1
    assert events == feed.published(0)[: len(events)]  # every event once, in order
    assert len(events) == len(feed.published(0))  # all published before the stream's end


def test_an_api_gateway_closing_long_requests_is_a_cut() -> None:
    feed = DemoFeed(partitions=1, events=100)
    with CountingServer(feed) as server:
        gateway = Gateway(server.url, limit=0.4)
        try:
            with stream_client(gateway.url, 2000) as client:
                publisher = publish_during(feed, 1.5)
                started = time.monotonic()
                events = read_texts(client)
                took = time.monotonic() - started
                publisher.join()
        finally:
            gateway.close()
    assert gateway.cuts >= 3
    assert events == feed.published(0)
    assert 2.0 <= took < 3.0
    assert all("stream" in query and "pageSizeHint" not in query for query in server.fetches)


def test_a_gateway_timeout_before_the_stream_is_retried_for_the_time_left() -> None:
    feed = DemoFeed(partitions=1, events=10)
    with CountingServer(feed) as server:
        with stream_client(server.url, 1000) as discovering:
            info = discovering.discover()  # directly: the gateway's 504s are for the stream's fetches
        gateway = Gateway(server.url, limit=5.0, timeouts=2)
        try:
            with stream_client(gateway.url, 1000, info=info) as client:
                started = time.monotonic()
                events = read_texts(client)
                took = time.monotonic() - started
        finally:
            gateway.close()
    assert events == feed.published(0)
    assert gateway.connections == 3 and len(server.fetches) == 1
    assert int(server.fetches[0]["stream"][0]) <= 1000 - 2 * 300  # after two Retry-After: 0.3
    assert 1.0 <= took < 1.5  # the duration, the refused attempts included


@pytest.mark.parametrize("dialect", ["draft", "published", "v1"])
def test_a_feed_whose_discovery_lacks_the_flag_pages(dialect: str, caplog: pytest.LogCaptureFixture) -> None:
    feed = DemoFeed(partitions=1, events=250)
    with CountingServer(feed, dialect=dialect, stream=False) as server:
        settings = feed_settings(url=server.url, stream_ms=5000, retry=FAST_RETRY, partition_count=1)
        with FeedClient(settings) as client, caplog.at_level(logging.WARNING):
            started = time.monotonic()
            events = read_texts(client)
            took = time.monotonic() - started
    assert events == feed.published(0)
    assert took < 2.0  # pages until caught up, never waits out a stream's duration
    fetches = [query for query in server.fetches if query]  # not v1's argument-less discovery (a 400)
    assert len(fetches) > 1
    page_size = "pageSizeHint" if dialect == "draft" else "pagesizehint"
    assert all(page_size in query and "stream" not in query for query in fetches)
    assert "discovery does not offer `stream`" in caplog.text


def test_a_slow_close_delimited_body_hands_on_its_first_lines_before_it_ends() -> None:
    """A body without Content-Length nor chunks (it ends with the connection), sent in two parts: the
    second only once the client has handed on the first page (or after 5 s)."""
    handed_on = threading.Event()
    waited: list[bool] = []

    def answer(handler) -> None:
        first = "_first" in handler.path
        handler.send_response(200)
        handler.send_header("Connection", "close")
        handler.end_headers()
        if not first:  # the next fetch: caught up
            handler.wfile.write(b'{"partition":0,"cursor":"c2"}\n')
            return
        handler.wfile.write(b'{"partition":0,"data":{"n":1}}\n{"partition":0,"cursor":"c1"}\n')
        handler.wfile.flush()
        waited.append(handed_on.wait(5))
        handler.wfile.write(b'{"partition":0,"data":{"n":2}}\n{"partition":0,"cursor":"c2"}\n')

    server = LocalServer(answer)
    try:
        client = FeedClient(feed_settings(url=server.url, dialect="v1", partition_count=1, retry=FAST_RETRY))
        with client:
            cursors: list[str] = []
            for run in client.page_runs(0):
                cursors.extend(run.cursors)
                handed_on.set()
    finally:
        server.close()
    assert waited == [True]  # the first page came while the server still held the rest
    assert cursors == ["c1", "c2"]


def test_an_encoded_body_is_decoded(canned) -> None:
    """Reading what arrives keeps the content decoding (gzip here)."""
    lines = b"".join(b'{"partition":0,"data":{"n":%d}}\n{"partition":0,"cursor":"c%d"}\n' % (n, n) for n in range(500))

    def respond(path, query, headers):
        body = lines if query["cursor0"] == ["_first"] else b'{"partition":0,"cursor":"c499"}\n'
        return 200, {"Content-Encoding": "gzip"}, gzip.compress(body)

    server = canned(respond)
    with FeedClient(feed_settings(url=server.url, dialect="v1", partition_count=1, retry=FAST_RETRY)) as client:
        runs = list(client.page_runs(0))
    assert [page.cursor for run in runs for page in run.pages()] == [f"c{n}" for n in range(500)]
    assert [event for run in runs for event in run.raw_events] == [b'{"n":%d}' % n for n in range(500)]
