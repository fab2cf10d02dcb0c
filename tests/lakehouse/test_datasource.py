"""`FeedDataSource`, the public PySpark data source `feedapi`, used without Dagster."""

import json

import pytest

from feedapi_dagster import FeedDataSource
from feedapi_dagster.demo import DemoFeed, DemoFeedServer, Faults, NakadiDemoServer, NakadiEventType
from feedapi_dagster.protocol import EventFilter, RetryPolicy, feed_settings
from feedapi_dagster.read.datasource import FeedSourceOptions
from feedapi_dagster.read.read_tasks import END_COLUMN, ReadEnd

TOKEN = "tok-datasource-7c1f-secret"


@pytest.fixture(scope="module")
def feedapi(spark):
    spark.dataSource.register(FeedDataSource)
    return spark


def by_partition(rows):
    grouped = {}
    for row in sorted(rows, key=lambda r: (r.partition_id, r.position)):
        grouped.setdefault(row.partition_id, []).append(row)
    return grouped


def test_with_only_a_url_it_reads_every_partition_from_first_to_its_end(feedapi):
    feed = DemoFeed(partitions=3, events=240, seed=51)
    with DemoFeedServer(feed, dialect="published") as server:
        frame = feedapi.read.format("feedapi").option("url", server.url).load()
        assert frame.columns == ["partition_id", "position", "cursor", "payload", "payload_type", "event_id"]
        assert frame.rdd.getNumPartitions() == 3  # one input partition per feed partition
        rows = by_partition(frame.collect())
    assert sorted(rows) == [0, 1, 2]
    for partition, got in rows.items():
        assert [r.payload for r in got] == feed.published(partition)
        assert [r.position for r in got] == list(range(len(got)))
        assert all(r.payload_type == "object" and r.event_id for r in got if r.payload.startswith("{"))


def test_a_nakadi_event_type_reads_through_the_same_source_each_eid_once(feedapi):
    event_type = NakadiEventType(partitions=2, events=200, seed=53, duplicate_ratio=0.2)
    with NakadiDemoServer(event_type, faults=Faults(0.3, seed=5, retry_after=0)) as server:
        frame = (
            feedapi.read.format("feedapi")
            .option("protocol", "nakadi")
            .option("url", server.url)
            .option("eventType", event_type.name)
            .option("pageSizeHint", "15")
            .option("retry", json.dumps({"base_delay": 0.001, "max_delay": 0.01, "max_attempts": 30}))
            .load()
        )
        rows = by_partition(frame.collect())
    assert sorted(rows) == [0, 1]
    for partition, got in rows.items():  # Nakadi's repeated events dropped in the read, by metadata.eid
        assert [r.payload for r in got] == event_type.expected_events(partition)
        assert [r.event_id for r in got] == [json.loads(r.payload)["metadata"]["eid"] for r in got]
        assert [r.position for r in got] == list(range(len(got)))


def test_incremental_options_resume_where_a_checkpoint_row_says(feedapi):
    feed = DemoFeed(partitions=3, events=300, seed=52)
    with DemoFeedServer(feed, dialect="draft") as server:
        feed_ = feed_settings(url=server.url, page_size_hint=20)
        first = (
            feedapi.read.format("feedapi")
            .options(**FeedSourceOptions(feed_, partitions=(1, 2), max_events=30, checkpoint_rows=True).spark_options())
            .load()
            .collect()
        )
        ends = {r.partition_id: r for r in first if r[END_COLUMN] is not None}
        assert sorted(ends) == [1, 2]
        for partition, end in ends.items():
            read = ReadEnd.from_json(end[END_COLUMN])
            assert 30 <= read.events == end.position < len(feed.published(partition)) and not read.drained
        rest = (
            feedapi.read.format("feedapi")
            .options(
                **FeedSourceOptions(
                    feed_,
                    partitions=(1, 2),
                    start_cursors={p: e.cursor for p, e in ends.items()},
                    start_positions={p: e.position for p, e in ends.items()},
                ).spark_options()
            )
            .load()
            .collect()
        )
    events = by_partition([r for r in first if r[END_COLUMN] is None] + rest)
    for partition in (1, 2):
        assert [r.payload for r in events[partition]] == feed.published(partition)
        assert [r.position for r in events[partition]] == list(range(len(feed.published(partition))))


def test_many_partitions_are_read_by_a_few_tasks_each_reading_several_at_once(feedapi):
    feed = DemoFeed(partitions=40, events=400, seed=55, exactly_once=False, duplicate_ratio=0.1)
    with DemoFeedServer(feed, dialect="published", faults=Faults(rate=0.1, seed=55, retry_after=0)) as server:
        options = FeedSourceOptions(
            feed_settings(url=server.url, page_size_hint=3, retry=RetryPolicy(base_delay=0.001)),
            tasks=3,
            checkpoint_rows=True,
        )
        frame = feedapi.read.format("feedapi").options(**options.spark_options()).load()
        assert frame.rdd.getNumPartitions() == 3
        rows = frame.collect()
    ends = {r.partition_id: ReadEnd.from_json(r[END_COLUMN]) for r in rows if r[END_COLUMN] is not None}
    events = by_partition([r for r in rows if r[END_COLUMN] is None])
    assert sorted(ends) == list(range(40))  # one checkpoint row per partition
    for partition in range(40):
        assert [r.payload for r in events.get(partition, [])] == feed.expected_events(partition)
        assert ends[partition].events == len(feed.expected_events(partition)) and ends[partition].error is None


def test_a_50_mb_event_loads(feedapi):
    feed = DemoFeed(partitions=1, events=5, seed=53)
    big = '{"id":"huge","blob":"' + "x" * (50 * 1024 * 1024) + '"}'
    feed.add_event(big, partition=0)
    with DemoFeedServer(feed, dialect="published") as server:
        rows = (
            feedapi.read.format("feedapi")
            .option("url", server.url)
            .load()
            .selectExpr("position", "length(payload) AS size", "event_id")
            .collect()
        )
    assert sorted(rows)[-1] == (5, len(big), "huge")


def test_bad_options_fail_with_a_message_that_names_them(feedapi):
    with pytest.raises(Exception, match="needs the option `url`"):
        feedapi.read.format("feedapi").load().collect()
    with pytest.raises(Exception, match="bad option"):
        feedapi.read.format("feedapi").option("url", "http://127.0.0.1:9/feed").option(
            "startCursors", "{not json"
        ).load().collect()


def test_the_bearer_token_is_not_in_the_plan(feedapi, capsys):
    feed = DemoFeed(partitions=2, events=50, seed=54)
    with DemoFeedServer(feed, dialect="published", token=TOKEN) as server:
        options = FeedSourceOptions(feed_settings(url=server.url, token=TOKEN))
        frame = feedapi.read.format("feedapi").options(**options.spark_options()).load()
        frame.explain("extended")
        frame.explain("formatted")
        assert frame.count() == sum(len(feed.published(p)) for p in (0, 1))  # the token worked
    assert TOKEN not in capsys.readouterr().out
    assert TOKEN not in repr(options) and TOKEN not in json.dumps(options.__repr__())


def test_one_feed_model_is_the_config_the_spark_options_and_the_client():
    feed = feed_settings(
        url="https://feeds.example.com/orders",
        dialect="published",
        page_size_hint=7,
        token=TOKEN,
        ca_bundle="/etc/ssl/feeds.pem",
        event_id_field="eid",
        filters=EventFilter(event_types=("a", "b")),
        retry=RetryPolicy(max_attempts=2),
    )
    read = FeedSourceOptions(
        feed, partitions=(1, 2), start_cursors={1: "c1"}, start_positions={1: 5}, checkpoint_rows=True, tasks=3
    )
    options = read.spark_options()
    assert options["pageSizeHint"] == "7" and options["caBundle"] == "/etc/ssl/feeds.pem"
    # Spark hands a source its options with lower-cased keys
    assert FeedSourceOptions.parse({key.lower(): value for key, value in options.items()}) == read
    assert TOKEN not in repr(read) and TOKEN not in repr(read.client())
    with pytest.raises(ValueError, match="bad option: pageSizeHint: Input should be greater than or equal to 1"):
        FeedSourceOptions.parse({"url": feed.url, "pagesizehint": "0"})


def test_the_options_are_the_protocols_settings_only():
    """A project's feed (`FeedConfig`: name, schedule, load...) gives the source its protocol's settings,
    nothing of the project; the options parse back into that protocol's settings model, and an option
    no field of it has is refused (another protocol's, a misspelt one)."""
    from feedapi_dagster.orchestration.config import FeedConfig

    feed = FeedConfig(
        name="orders",
        protocol="nakadi",
        url="https://nakadi.example.com",
        event_type="shop.order",
        page_size_hint=9,
        schedule={"cron": "0 * * * *"},
        load={"read_tasks": 2},
    )
    options = FeedSourceOptions(feed.settings).spark_options()
    assert options == {
        "url": "https://nakadi.example.com",
        "protocol": "nakadi",
        "eventType": "shop.order",
        "pageSizeHint": "9",
    }
    parsed = FeedSourceOptions.parse({key.lower(): value for key, value in options.items()})
    assert parsed.feed == feed.settings and type(parsed.feed).__name__ == "NakadiSettings"
    with pytest.raises(ValueError, match="bad option: dialect: not a setting of protocol nakadi"):
        FeedSourceOptions.parse({**options, "dialect": "draft"})
    with pytest.raises(ValueError, match="bad option: eventType: not a setting of protocol feedapi"):
        FeedSourceOptions.parse({"url": feed.url, "eventType": "shop.order"})
    # (a test's own protocol may be registered in this process too)
    with pytest.raises(
        ValueError,
        match="bad option: protocol: unknown protocol 'kafka': the registered ones are feedapi, (.+, )?nakadi",
    ):
        FeedSourceOptions.parse({"url": feed.url, "protocol": "kafka"})
