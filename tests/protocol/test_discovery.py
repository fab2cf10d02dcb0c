"""Discovery negotiation and tolerant parsing, over real HTTP against scripted replies."""

import pytest

from feedapi_dagster.protocol import FeedClient, ProtocolError, feed_settings

from .conftest import json_reply


def test_tolerant_document_ids_aliases_unknown_fields(canned):
    document = {
        "partitions": [
            {"id": "0", "closed": True, "lastCursor": "c9", "colour": "blue"},
            {"id": 1, "startsAfterParent": "0"},
            {"id": "2", "startsAfterPartition": 0},
            {"id": "24223", "splitFromAncestors": ["24001", 24100]},
            {"id": "25000", "cursorFromPartitions": "24001"},
            {"id": "40000"},
            {"id": "x"},
        ],
        "stream": True,
        "filters": ["subject"],
        "somethingNew": {"a": 1},
    }
    server = canned(lambda path, query, headers: json_reply(document))
    info = FeedClient(feed_settings(url=server.url)).discover()
    assert (info.protocol, info.dialect, info.exactly_once) == ("feedapi", "draft", False)  # "filters": ignored
    by_id = {p.id: p for p in info.partitions}
    assert sorted(by_id) == [0, 1, 2, 24223, 25000]
    assert by_id[0].closed and by_id[0].last_cursor == "c9"
    assert by_id[1].starts_after == 0 and by_id[2].starts_after == 0
    assert by_id[24223].cursor_from == [24001, 24100] and by_id[25000].cursor_from == [24001]
    assert len(info.rejected) == 2
    assert "40000 is outside 0..32767" in info.rejected[0] and "'x'" in info.rejected[1]


def test_published_dialect_and_go_parent_zero_quirk(canned):
    document = {
        "token": "t1",
        "exactlyOnce": True,
        "partitions": [{"id": "0", "closed": True}, {"id": "1"}, {"id": "2", "startsAfterPartition": "0"}],
    }
    server = canned(lambda path, query, headers: json_reply(document))
    info = FeedClient(feed_settings(url=server.url)).discover()
    assert (info.dialect, info.token, info.exactly_once) == ("published", "t1", True)
    assert info.partition(1).starts_after == 0 and info.partition(1).starts_after_inferred
    assert not info.partition(2).starts_after_inferred


def test_400_means_v1_and_v1_needs_a_partition_count(canned):
    server = canned(lambda path, query, headers: (400, {}, b"no cursors"))
    with pytest.raises(ProtocolError, match="configure partition_count"):
        FeedClient(feed_settings(url=server.url)).discover()
    info = FeedClient(feed_settings(url=server.url, partition_count=3)).discover()
    assert info.dialect == "v1" and [p.id for p in info.partitions] == [0, 1, 2] and not info.exactly_once


@pytest.mark.parametrize("status", [401, 403, 404])
def test_errors_never_fall_back_to_v1(canned, status):
    server = canned(lambda path, query, headers: (status, {}, b"go away"))
    with pytest.raises(ProtocolError, match=f"HTTP {status}.*go away") as caught:
        FeedClient(feed_settings(url=server.url, partition_count=3)).discover()
    assert caught.value.status == status


def test_5xx_is_retried_then_fails_clearly(canned):
    server = canned(lambda path, query, headers: (503, {"Retry-After": "0"}, b"busy"))
    from feedapi_dagster.protocol import RetryPolicy

    client = FeedClient(feed_settings(url=server.url, retry=RetryPolicy(max_attempts=3, base_delay=0)))
    with pytest.raises(ProtocolError, match="giving up after 3 attempts: discovery: HTTP 503"):
        client.discover()
    assert len(server.requests) == 3


@pytest.mark.parametrize("body", [b"not json", b"[1,2]", b'{"partition": []}'])
def test_malformed_discovery_is_a_clear_error(canned, body):
    server = canned(lambda path, query, headers: (200, {}, body))
    with pytest.raises(ProtocolError, match="discovery"):
        FeedClient(feed_settings(url=server.url)).discover()


def test_forced_dialect_skips_negotiation(canned):
    document = {"token": "t1", "partitions": [{"id": "0"}]}
    server = canned(lambda path, query, headers: json_reply(document))
    assert FeedClient(feed_settings(url=server.url, dialect="draft")).discover().dialect == "draft"
    client = FeedClient(feed_settings(url=server.url, dialect="v1", partition_count=2))
    assert client.discover().dialect == "v1"
    assert len(server.requests) == 1  # v1 has no discovery request


@pytest.mark.parametrize("url", ["ftp://example.com/feed", "file:///etc/passwd", "127.0.0.1:8000/feed"])
def test_only_http_urls(url):
    with pytest.raises(ProtocolError, match="http or https"):
        FeedClient(feed_settings(url=url))
