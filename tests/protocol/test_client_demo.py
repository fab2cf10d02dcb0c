"""FeedClient against the bundled demo server over real HTTP, in every dialect, with faults on."""

import time

import pytest

from feedapi_dagster.demo import DemoFeed, DemoFeedServer, Faults
from feedapi_dagster.protocol import (
    EventFilter,
    FeedClient,
    ProtocolError,
    RediscoveryNeeded,
    RetryPolicy,
    feed_settings,
)

from .conftest import json_reply, pages_of, payloads, texts

FAST_RETRY = RetryPolicy(max_attempts=12, base_delay=0.001, max_delay=0.01)
DIALECTS = ["v1", "draft", "published"]


def client_for(server, feed, **kwargs):
    kwargs.setdefault("retry", FAST_RETRY)
    kwargs.setdefault("page_size_hint", 37)
    if server.dialect == "v1":
        kwargs["partition_count"] = feed.partition_count()
    return FeedClient(feed_settings(url=server.url, **kwargs))


def read_all(client, partition, cursor="_first"):
    pages = pages_of(client, partition, cursor)
    return [text for p in pages for text in texts(p)], (pages[-1].cursor if pages else cursor)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_partition_exactly_once_in_order_with_faults(dialect):
    feed = DemoFeed(partitions=4, events=1500, seed=3)
    faults = Faults(rate=0.25, seed=11, retry_after=0)
    with DemoFeedServer(feed, dialect=dialect, faults=faults, quirks=True) as server:
        client = client_for(server, feed, page_size_hint=13)
        info = client.discover()
        assert info.dialect == dialect
        for partition in info.partitions:
            events, _ = read_all(client, partition.id)
            assert events == feed.published(partition.id)
        assert sum(server.fault_counts.values()) > 20
        assert set(server.fault_counts) == {"500", "503", "429", "reset", "truncated", "junk", "slow"}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_resume_from_a_cursor_then_read_appends_only(dialect):
    feed = DemoFeed(partitions=2, events=400, seed=1)
    with DemoFeedServer(feed, dialect=dialect, empty_when_caught_up=(dialect == "published")) as server:
        client = client_for(server, feed)
        pages = pages_of(client, 0)
        middle = pages[len(pages) // 2]
        covered = sum(len(p.raw_events) for p in pages[: len(pages) // 2 + 1])
        rest, last = read_all(client, 0, middle.cursor)
        assert rest == feed.published(0)[covered:]
        assert read_all(client, 0, last) == ([], last)  # caught up: nothing, cursor kept
        feed.append(50, partition=0)
        new, _ = read_all(client, 0, last)
        assert new == feed.published(0)[-50:]


def test_draft_closed_partition_reads_to_its_last_cursor():
    feed = DemoFeed(partitions=2, events=300, seed=2)
    feed.close(1)
    with DemoFeedServer(feed, dialect="draft") as server:
        client = client_for(server, feed)
        partition = client.discover().partition(1)
        assert partition.closed and partition.last_cursor
        events, last = read_all(client, 1)
        assert events == feed.published(1) and last == partition.last_cursor


def test_method2_child_continues_from_the_parents_cursor():
    feed = DemoFeed(partitions=1, events=300, seed=4)
    with DemoFeedServer(feed, dialect="draft") as server:
        client = client_for(server, feed)
        _, parent_cursor = read_all(client, 0)
        feed.append(40, partition=0)
        appended = set(feed.published(0)[-40:])
        children = feed.split_method2(0, children=2)
        info = client.discover()
        assert info.partition(0) is None and {p.id for p in info.partitions} == set(children)
        read = []
        for child in children:
            assert info.partition(child).cursor_from == [0]
            events, _ = read_all(client, child, parent_cursor)
            # only what came after the parent's cursor, in the child's order: no history twice
            assert events == [e for e in feed.published(child) if e in appended]
            read += events
        assert sorted(read) == sorted(appended)


def test_token_change_raises_rediscovery_needed_then_reads_on():
    feed = DemoFeed(partitions=2, events=200, seed=5)
    with DemoFeedServer(feed, dialect="published") as server:
        client = client_for(server, feed)
        client.discover()
        _, cursor = read_all(client, 0)
        server.rotate_token()
        feed.append(10, partition=0)
        with pytest.raises(RediscoveryNeeded) as caught:
            pages_of(client, 0, cursor)
        assert caught.value.status == 409 and caught.value.partition == 0
        client.discover()
        assert read_all(client, 0, cursor)[0] == feed.published(0)[-10:]


def test_bearer_token_is_sent_and_never_shown():
    secret = "tok-Zq81-very-secret"
    feed = DemoFeed(partitions=1, events=50, seed=6)
    with DemoFeedServer(feed, dialect="draft", token=secret) as server:
        assert read_all(client_for(server, feed, token=secret), 0)[0] == feed.published(0)
        with pytest.raises(ProtocolError, match="401") as caught:
            client_for(server, feed, token="wrong-" + secret).discover()
        assert secret not in str(caught.value) and secret not in repr(client_for(server, feed, token=secret))
        with pytest.raises(ProtocolError, match="wants a bearer token"):
            client_for(server, feed).discover()


def test_published_type_filters_are_reapplied_when_the_server_ignores_them():
    feed = DemoFeed(partitions=1, events=300, seed=7, string_ratio=0)
    with DemoFeedServer(feed, dialect="published", ignore_filters=True) as server:
        for event_filter, keep in [
            (EventFilter(event_types=("order.paid",)), {"order.paid"}),
            (EventFilter(skip_event_types=("order.paid",)), {"order.created", "order.shipped"}),
        ]:
            client = client_for(server, feed, filters=event_filter)
            events = [e for p in pages_of(client, 0) for e in payloads(p)]
            assert events and {e["type"] for e in events} == keep
            assert [e["id"] for e in events] == [
                e["id"] for e in map(__import__("json").loads, feed.published(0)) if e["type"] in keep
            ]
    with pytest.raises(ValueError, match="cannot both"):
        EventFilter(event_types=("a",), skip_event_types=("b",))


def test_draft_filter_is_sent_and_cursor_only_pages_advance():
    feed = DemoFeed(partitions=1, events=300, seed=8, string_ratio=0)
    with DemoFeedServer(feed, dialect="draft") as server:
        client = client_for(server, feed, filters=EventFilter(fields={"type": "order.shipped"}))
        pages = pages_of(client, 0)
        assert any(not p.raw_events for p in pages) or len(pages) >= 1
        assert {e["type"] for p in pages for e in payloads(p)} == {"order.shipped"}
        bad = client_for(server, feed, filters=EventFilter(fields={"colour": "red"}))
        with pytest.raises(ProtocolError, match="HTTP 400"):
            pages_of(bad, 0)


def test_large_events_of_several_megabytes():
    feed = DemoFeed(partitions=1, events=5, seed=9)
    big = '{"id":"big","type":"order.created","blob":"' + "é" * 3_000_000 + '"}'
    feed.add_event(big, partition=0)
    feed.append(3, partition=0)
    with DemoFeedServer(feed, dialect="draft") as server:
        assert read_all(client_for(server, feed), 0)[0] == feed.published(0)


def test_bad_cursor_fails_fast_with_the_servers_message():
    feed = DemoFeed(partitions=1, events=5, seed=10)
    with DemoFeedServer(feed, dialect="draft") as server:
        with pytest.raises(ProtocolError, match="partition 0: fetch failed \\(HTTP 400\\)") as caught:
            pages_of(client_for(server, feed), 0, "not-a-cursor")
        assert caught.value.partition == 0


def test_retries_give_up_with_a_clear_error():
    feed = DemoFeed(partitions=1, events=5, seed=12)
    with DemoFeedServer(
        feed,
        dialect="draft",
        faults=Faults(rate=1.0, seed=1, retry_after=0, kinds=("500", "reset", "truncated", "junk")),
    ) as server:
        client = client_for(server, feed, retry=RetryPolicy(max_attempts=4, base_delay=0.001))
        with pytest.raises(ProtocolError, match="partition 0: giving up after 4 attempts"):
            pages_of(client, 0)


def test_retry_after_is_honoured(canned):
    replies = [(429, {"Retry-After": "1"}, b"slow down"), json_reply({"partitions": [{"id": "0"}]})]
    server = canned(lambda path, query, headers: replies.pop(0))
    started = time.monotonic()
    FeedClient(feed_settings(url=server.url, retry=RetryPolicy(base_delay=0))).discover()
    assert time.monotonic() - started >= 0.9
