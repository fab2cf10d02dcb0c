"""Nakadi through `FeedClient`, over real HTTP against the bundled Nakadi server: partitions, the
low-level event stream in batches from a cursor, where a read stops, faults retried from the last
batch, Problem bodies, retention gaps, and the settings a Nakadi feed takes."""

import time

import msgspec
import pytest

from feedapi_dagster.demo import Faults
from feedapi_dagster.demo.faults import KINDS
from feedapi_dagster.demo.nakadi import NakadiDemoServer, NakadiEventType
from feedapi_dagster.protocol import FeedClient, FeedSettings, ProtocolError, RetryPolicy, feed_settings
from feedapi_dagster.protocol.nakadi.protocol import BATCH_FLUSH_TIMEOUT
from feedapi_dagster.protocol.registry import registered_protocols
from feedapi_dagster.read.rows import event_ids

FAST = RetryPolicy(max_attempts=12, base_delay=0.001, max_delay=0.01)


def nakadi_feed(server, **options) -> FeedSettings:
    options.setdefault("retry", FAST)
    return feed_settings(url=server.url, protocol="nakadi", event_type=server.event_type.name, **options)


def read(client, partition, cursor="_first"):
    """(eids in order, last cursor, runs) of a read of `partition` after `cursor`."""
    eids, runs = [], 0
    for run in client.page_runs(partition, cursor):
        runs += 1
        eids += [msgspec.json.decode(raw)["metadata"]["eid"] for raw in run.raw_events]
        cursor = run.cursor
    return eids, cursor, runs


def in_order(event_type, partition):
    """The eids the server holds for `partition`, in offset order (duplicates included)."""
    return [msgspec.json.decode(raw)["metadata"]["eid"] for _, raw in event_type.read(partition, "BEGIN", 10**9)]


@pytest.fixture
def event_type():
    return NakadiEventType(partitions=3, events=400, seed=5, duplicate_ratio=0.1)


def test_partitions_and_a_whole_read_in_batches(event_type):
    with NakadiDemoServer(event_type) as server, FeedClient(nakadi_feed(server, page_size_hint=25)) as client:
        info = client.discover()
        assert (
            info.protocol == "nakadi" and info.dialect is None and not info.exactly_once
        )  # Nakadi delivers at least once
        assert [p.id for p in info.partitions] == [0, 1, 2]
        for partition in info.partitions:
            eids, cursor, runs = read(client, partition.id)
            assert eids == in_order(event_type, partition.id)  # duplicates too: the loads drop them
            assert cursor == partition.last_cursor  # the newest offset the listing gave
            assert runs >= 1
        assert len(set(eids)) < len(eids)  # the demo's at-least-once duplicates are on the wire


def test_a_read_resumes_after_its_cursor_and_a_caught_up_partition_costs_no_request(event_type):
    with NakadiDemoServer(event_type) as server, FeedClient(nakadi_feed(server, page_size_hint=7)) as client:
        client.discover()
        first = list(client.page_runs(1))
        middle = first[len(first) // 2].cursor
        expected = in_order(event_type, 1)
        eids, end, _ = read(client, 1, middle)
        before = sum(len(run.raw_events) for run in first[: len(first) // 2 + 1])
        assert eids == expected[before:]
        started = time.monotonic()
        assert read(client, 1, end) == ([], end, 0)  # at the listed newest offset: no request at all
        assert time.monotonic() - started < 0.05


def test_a_read_stops_at_the_listed_newest_offset_or_at_a_keep_alive_batch(event_type):
    with NakadiDemoServer(event_type) as server, FeedClient(nakadi_feed(server, page_size_hint=1000)) as client:
        listed = client.discover()
        _, cursor, _ = read(client, 0)
        event_type.append(60)
        # the listing taken before: the read ends where it said, events published since wait for the next
        assert read(client, 0, cursor) == ([], cursor, 0)
        fresh = client.discover()
        eids, end, _ = read(client, 0, cursor)
        assert eids == in_order(event_type, 0)[-len(eids) :] and end == fresh.partition(0).last_cursor
        # a listed end that no batch reaches (a compacted event type drops the newest offsets' events):
        # the keep-alive batch after the last events ends the read, within Nakadi's batch flush timeout
        beyond = listed.model_copy(
            update={
                "partitions": [
                    p.model_copy(update={"last_cursor": "001-0001-000000000099999999"}) for p in listed.partitions
                ]
            }
        )
        client = FeedClient(client.feed, info=beyond)
        started = time.monotonic()
        eids, _, runs = read(client, 0, cursor)
        assert eids == in_order(event_type, 0)[-len(eids) :] and len(eids) >= 1 and runs == 1
        assert time.monotonic() - started < BATCH_FLUSH_TIMEOUT + 1


@pytest.mark.parametrize("kind", KINDS)
def test_each_wire_fault_is_retried_from_the_last_batch(event_type, kind):
    with NakadiDemoServer(event_type, faults=Faults(0.5, seed=3, retry_after=0, kinds=(kind,))) as server:
        with FeedClient(nakadi_feed(server, page_size_hint=10)) as client:
            client.discover()
            eids, _, _ = read(client, 2)
        assert server.fault_counts.get(kind, 0) > 0
    assert eids == in_order(event_type, 2)  # nothing lost, nothing read twice


def test_a_repartitioning_adds_partitions_that_start_from_begin(event_type):
    with NakadiDemoServer(event_type) as server, FeedClient(nakadi_feed(server)) as client:
        assert len(client.discover().partitions) == 3
        new = event_type.repartition(5)
        event_type.append(200)
        info = client.discover()
        assert [p.id for p in info.partitions] == [0, 1, 2, 3, 4] and new == [3, 4]
        eids, _, _ = read(client, 4)
        assert eids and eids == in_order(event_type, 4)


@pytest.mark.parametrize(
    "sent, status, said",
    [
        (None, 401, "Unauthorized"),
        ("wrong-token-value", 403, "Forbidden"),
    ],
)
def test_refused_tokens_quote_the_problem_and_never_the_token(event_type, sent, status, said, monkeypatch):
    with NakadiDemoServer(event_type, token="the-right-token") as server:
        options = {}
        if sent:
            monkeypatch.setenv("NAKADI_TEST_TOKEN", sent)
            options["token_env"] = "NAKADI_TEST_TOKEN"
        with pytest.raises(ProtocolError) as error:
            FeedClient(nakadi_feed(server, **options)).discover()
        assert error.value.status == status
        assert said in str(error.value) and "not authorized" in str(error.value)
        assert "the-right-token" not in str(error.value) and "wrong-token-value" not in str(error.value)
        monkeypatch.setenv("NAKADI_TEST_TOKEN", "the-right-token")
        assert FeedClient(nakadi_feed(server, token_env="NAKADI_TEST_TOKEN")).discover().partitions


def test_the_event_types_json_schema_declares_the_columns(event_type, canned, monkeypatch):
    """`GET /event-types/{name}` with the feed's token: the demo's JSON Schema types each field of its
    events (`metadata` is Nakadi's, inferred); a protocol with nothing to ask declares nothing."""
    monkeypatch.setenv("NAKADI_TEST_TOKEN", "the-right-token")
    with NakadiDemoServer(event_type, token="the-right-token") as server:
        with FeedClient(nakadi_feed(server, token_env="NAKADI_TEST_TOKEN")) as client:
            assert client.declared_columns() == {"order_number": "STRING", "amount": "DOUBLE", "seq": "BIGINT"}
    feedapi = canned(lambda path, query, headers: (500, {}, b"asked"))
    with FeedClient(feed_settings(url=feedapi.url, retry=FAST)) as client:
        assert client.declared_columns() == {}
    assert feedapi.requests == []


@pytest.mark.parametrize(
    "name, token, status, said",
    [
        (
            "demo.gone",
            "the-right-token",
            404,
            "event type 'demo.gone' not found (HTTP 404): Not Found: event type demo.gone does not exist",
        ),
        (
            "demo.orders",
            None,
            401,
            "event type lookup not authorized (HTTP 401): the server wants a bearer token: Unauthorized: no Authorization header: send Authorization: Bearer <token>",
        ),
        (
            "demo.orders",
            "wrong-token-value",
            403,
            "event type lookup not authorized (HTTP 403): the token was refused: Forbidden: the bearer token may not read this event type",
        ),
    ],
    ids=["unknown event type", "no token", "wrong token"],
)
def test_a_refused_event_type_lookup_says_why(event_type, name, token, status, said, monkeypatch):
    with NakadiDemoServer(event_type, token="the-right-token") as server:
        options = {}
        if token:
            monkeypatch.setenv("NAKADI_TEST_TOKEN", token)
            options["token_env"] = "NAKADI_TEST_TOKEN"
        feed = feed_settings(url=server.url, protocol="nakadi", event_type=name, retry=FAST, **options)
        with FeedClient(feed) as client, pytest.raises(ProtocolError) as error:
            client.declared_columns()
    assert str(error.value) == f"feed {server.url}: {said}" and error.value.status == status
    assert "the-right-token" not in str(error.value)


def test_an_event_type_answer_that_is_no_event_type_is_a_clear_error(canned):
    answers = iter([(200, {}, b"<html>login</html>"), (200, {}, b'{"name": "demo.orders"}')])
    server = canned(lambda path, query, headers: next(answers))
    feed = feed_settings(url=server.url, protocol="nakadi", event_type="demo.orders", retry=FAST)
    for said in [
        "the event type lookup response is not JSON",
        "event type 'demo.orders': the event type has no schema object",
    ]:
        with FeedClient(feed) as client, pytest.raises(ProtocolError) as error:
            client.declared_columns()
        assert str(error.value) == f"feed {server.url}: {said}"
    assert [path for path, _, _ in server.requests] == ["/feed/event-types/demo.orders"] * 2


def test_retention_gap_is_named_and_a_too_old_cursor_is_a_clear_422(event_type):
    protocol = registered_protocols()["nakadi"]
    with NakadiDemoServer(event_type) as server, FeedClient(nakadi_feed(server, page_size_hint=5)) as client:
        info = client.discover()
        # the first batch's: a run holds the batches that had arrived together
        cursor = next(next(iter(client.page_runs(0))).pages()).cursor
        assert protocol.retention_gap(info.partition(0), cursor) is None
        event_type.expire(0, keep_last=20)
        info = client.discover()
        gap = protocol.retention_gap(info.partition(0), cursor)
        oldest = info.partition(0).oldest_available
        assert gap and "partition 0" in gap and cursor in gap and oldest in gap
        assert protocol.retention_gap(info.partition(0), "_first") is None  # BEGIN: the oldest there is
        with pytest.raises(ProtocolError) as error:
            list(client.page_runs(0, cursor))
        assert error.value.status == 422 and "Unprocessable Entity" in str(error.value) and oldest in str(error.value)
        eids, _, _ = read(client, 0)
        assert len(eids) == 20


def test_events_behind_a_cursor_are_counted_from_the_listings_newest_offset(event_type):
    """What a read of the partition after the cursor would give (Nakadi's duplicates included: they
    are events on the wire), from the listing alone; FeedAPI's discovery cannot say."""
    protocol = registered_protocols()["nakadi"]
    with NakadiDemoServer(event_type) as server, FeedClient(nakadi_feed(server, page_size_hint=9)) as client:
        partition = client.discover().partition(1)
        assert protocol.events_behind(partition, "_first") == len(in_order(event_type, 1))
        cursor = next(next(iter(client.page_runs(1))).pages()).cursor  # the first batch read
        eids, newest, _ = read(client, 1, cursor)
        assert protocol.events_behind(partition, cursor) == len(eids) > 0
        assert protocol.events_behind(partition, newest) == 0
        event_type.expire(1, keep_last=0)  # all gone: nothing left to read after any cursor
        assert protocol.events_behind(client.discover().partition(1), "_first") == 0
        event_type.repartition(4)  # a new partition that never had an event
        assert protocol.events_behind(client.discover().partition(3), "_first") == 0
    assert not registered_protocols()["feedapi"].tells_newest_events


def test_the_event_id_is_metadata_eid():
    raws = [
        b'{"metadata":{"eid":"e-1","occurred_at":"x"},"a":1}',
        b'{"a":1,"metadata":{"occurred_at":"x","eid":"e-2"}}',
        b'{"metadata":"not an object"}',
        b'{"metadata":{"eid":"e-3","eid":"e-4"}}',
    ]
    assert event_ids(raws, feed_settings(url="http://x", protocol="nakadi", event_type="t").event_id_field) == [
        b"e-1",
        b"e-2",
        None,
        b"e-3",
    ]  # the first of duplicate keys, as for top-level ids


@pytest.mark.parametrize(
    "options, message",
    [
        ({"protocol": "nakadi"}, r"NakadiSettings\nevent_type\n  Field required"),
        # each protocol's settings model forbids what it does not have: FeedAPI's settings, Nakadi's
        ({"protocol": "nakadi", "event_type": "t", "dialect": "draft"}, r"\ndialect\n  Extra inputs are not permitted"),
        ({"protocol": "nakadi", "event_type": "t", "filters": {"fields": {"a": "b"}}}, r"\nfilters\n  Extra inputs"),
        ({"event_type": "t"}, r"FeedApiSettings\nevent_type\n  Extra inputs are not permitted"),
        ({"protocol": "kafka"}, "unknown protocol 'kafka': the registered ones are feedapi, (.+, )?nakadi"),
    ],
)
def test_settings_that_make_no_sense_for_the_protocol_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        feed_settings(url="http://127.0.0.1:1", **options)
