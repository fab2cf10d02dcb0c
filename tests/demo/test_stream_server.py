"""The demo FeedAPI server's `stream` fetches over real HTTP on 127.0.0.1 (the draft dialect): the
discovery flag, the requests it refuses, a stream kept open with keep-alive checkpoints until its end or
the server's, a closed partition's stream, and the console flags."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import requests

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.demo.feedapi.stream import KEEP_ALIVE_SECONDS


def open_stream(url: str, partition: int, cursor: str, stream: str) -> requests.Response:
    response = requests.get(url, params={"partition": partition, "cursor": cursor, "stream": stream}, stream=True)
    assert response.status_code == 200, response.text
    assert response.headers["Transfer-Encoding"] == "chunked"
    return response


def lines_of(response: requests.Response) -> list[dict]:
    """The stream's lines, as they arrive (a timed list: read until the body ends)."""
    return [json.loads(line) for line in response.iter_lines() if line]


def test_discovery_flag() -> None:
    feed = DemoFeed(partitions=1, events=1)
    with DemoFeedServer(feed, dialect="draft") as server:
        assert requests.get(server.url).json()["stream"] is True
    with DemoFeedServer(feed, dialect="draft", stream=False) as server:
        assert "stream" not in requests.get(server.url).json()
    with DemoFeedServer(feed, dialect="published") as server:
        assert "stream" not in requests.get(server.url).json()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"stream": "1000", "pageSizeHint": "10"}, "not compatible"),
        ({"stream": "soon"}, "stream must be an integer"),
        ({"stream": "-5"}, "stream must be a number of milliseconds"),
    ],
)
def test_refused_streams(params: dict[str, str], message: str) -> None:
    with DemoFeedServer(DemoFeed(partitions=1, events=1)) as server:
        response = requests.get(server.url, params={"partition": 0, "cursor": "_first", **params})
    assert response.status_code == 400 and message in response.text


def test_a_server_without_the_flag_refuses_a_stream() -> None:
    with DemoFeedServer(DemoFeed(partitions=1, events=1), stream=False) as server:
        response = requests.get(server.url, params={"partition": 0, "cursor": "_first", "stream": "100"})
    assert response.status_code == 400 and "not supported" in response.text


def test_a_stream_sends_the_events_there_then_the_appended_ones_and_ends_after_its_duration() -> None:
    feed = DemoFeed(partitions=1, events=4)
    with DemoFeedServer(feed) as server:
        started = time.monotonic()
        response = open_stream(server.url, 0, "_first", "600")
        lines = response.iter_lines()
        first = [json.loads(next(lines)) for _ in range(2)]
        feed.add_event('{"id":"late"}', partition=0)
        rest = [json.loads(line) for line in lines if line]
        took = time.monotonic() - started
    events = [line["event"] for line in first + rest if "event" in line]
    # the demo's payloads: objects (published as their text) and strings
    assert events == [json.loads(text) if text.startswith("{") else text for text in feed.published(0)]
    assert events[-1] == {"id": "late"} and len(events) == 5
    assert "cursor" in rest[-1]  # the stream's last line is a checkpoint
    assert 0.6 <= took < 1.5


def test_a_stream_without_end_keeps_alive_until_the_server_stops() -> None:
    feed = DemoFeed(partitions=1, events=0)
    server = DemoFeedServer(feed).start()
    try:
        response = open_stream(server.url, 0, "_first", "y")
        lines = response.iter_lines()
        opened = json.loads(next(lines))  # a checkpoint at once: the stream is open
        waited = time.monotonic()
        keep_alive = json.loads(next(lines))
        assert keep_alive == opened and time.monotonic() - waited >= KEEP_ALIVE_SECONDS * 0.9
    finally:
        server.stop()
    with pytest.raises(requests.exceptions.ChunkedEncodingError):  # cut: no terminating chunk
        list(lines)


def test_the_stream_of_a_closed_partition_ends_once_drained() -> None:
    feed = DemoFeed(partitions=2, events=20)
    with DemoFeedServer(feed) as server:
        started = time.monotonic()
        response = open_stream(server.url, 0, "_first", "5000")
        feed.close(0)
        lines = lines_of(response)
    assert time.monotonic() - started < 2.0
    assert [line["cursor"] for line in lines if "cursor" in line][-1] == f"c{feed.discovery()[0].last_seq:012x}"


def test_console_demo_server_streams_what_it_publishes() -> None:
    command = [sys.executable, "-m", "feedapi_dagster.cli", "demo-server", "--port", "0", "--events", "0"]
    with subprocess.Popen([*command, "--publish-rate", "50"], stdout=subprocess.PIPE, text=True) as process:
        try:
            url = process.stdout.readline().strip()  # type: ignore[union-attr]
            assert requests.get(url, timeout=5).json()["stream"] is True
            lines = lines_of(open_stream(url, 0, "_first", "1000"))
            assert [line for line in lines if "event" in line]  # published while the stream was open
        finally:
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    with subprocess.Popen([*command, "--no-stream"], stdout=subprocess.PIPE, text=True) as process:
        try:
            url = process.stdout.readline().strip()  # type: ignore[union-attr]
            assert "stream" not in requests.get(url, timeout=5).json()
        finally:
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
