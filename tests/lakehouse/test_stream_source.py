"""`spark.readStream.format("feedapi")` written to Delta with `writeStream`: every event once."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from feedapi_dagster import FeedDataSource
from feedapi_dagster.demo import DemoFeed, DemoFeedServer, Gate
from feedapi_dagster.lakehouse.feed_stream import stream_to_delta
from feedapi_dagster.read.rows import TABLE_SCHEMA

from ..spark_processes import kill, python_workers
from .conftest import table_rows

SCRIPT = Path(__file__).with_name("stream_to_delta.py")


@pytest.fixture(scope="module")
def feedapi(spark):
    spark.dataSource.register(FeedDataSource)
    return spark


@pytest.fixture
def paths(tmp_path):
    return str(tmp_path / "table"), str(tmp_path / "checkpoint")


def events(spark, url, **options):
    reader = spark.readStream.format("feedapi").option("url", url).option("pageSizeHint", "10")
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def available_now(spark, url, paths, **options):
    """One availableNow query; its micro-batches' input rows."""
    query = stream_to_delta(events(spark, url, **options), *paths).trigger(availableNow=True).start()
    assert query.awaitTermination(240), "the availableNow query did not end"
    assert query.exception() is None
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def assert_holds(spark, table, feed, partitions, expected=None):
    """Each partition's rows are what the feed published there, once, positions from 0."""
    for partition in partitions:
        rows = table_rows(spark, table, partition)
        want = (expected or feed.published)(partition)
        assert [r.payload for r in rows] == want, f"partition {partition}"
        assert [r.position for r in rows] == list(range(len(rows)))


def wait_for(condition, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def test_an_available_now_catch_up_lands_every_event_once_then_the_next_one_only_what_came(feedapi, paths):
    feed = DemoFeed(partitions=3, events=900, seed=61)
    with DemoFeedServer(feed, dialect="published") as server:
        assert sum(available_now(feedapi, server.url, paths)) == 900
        assert_holds(feedapi, paths[0], feed, (0, 1, 2))
        frame = feedapi.read.format("delta").load(paths[0])
        assert frame.columns == TABLE_SCHEMA.names  # the batch loads' table
        assert frame.where("loaded_at IS NULL OR run_id IS NULL").count() == 0
        feed.append(120)
        assert available_now(feedapi, server.url, paths) == [120]  # only the appended events
        assert available_now(feedapi, server.url, paths) == []  # nothing new: no micro-batch
        assert_holds(feedapi, paths[0], feed, (0, 1, 2))


def test_max_events_per_trigger_bounds_each_micro_batch(feedapi, paths):
    feed = DemoFeed(partitions=2, events=400, seed=62)
    with DemoFeedServer(feed, dialect="draft") as server:
        batches = available_now(feedapi, server.url, paths, maxEventsPerTrigger=40)
        assert sum(batches) == 400 and len(batches) >= 10
        assert max(batches) <= 40  # pages of 10, a share of 20 per partition
        assert_holds(feedapi, paths[0], feed, (0, 1))


def test_a_processing_time_query_picks_up_appended_events(feedapi, paths):
    feed = DemoFeed(partitions=2, events=200, seed=63)
    with DemoFeedServer(feed, dialect="published") as server:
        query = stream_to_delta(events(feedapi, server.url), *paths).trigger(processingTime="1 second").start()
        try:
            count = lambda: feedapi.read.format("delta").load(paths[0]).count()  # noqa: E731
            wait_for(lambda: count() == 200)
            feed.append(50)
            wait_for(lambda: count() == 250)
            feed.append(30)
            wait_for(lambda: count() == 280)
            assert query.exception() is None
        finally:
            query.stop()
        assert_holds(feedapi, paths[0], feed, (0, 1))


def test_a_method_1_split_during_a_stream_reads_the_children_after_the_drained_parent(feedapi, paths):
    feed = DemoFeed(partitions=2, events=300, seed=64)
    with DemoFeedServer(feed, dialect="published") as server:
        available_now(feedapi, server.url, paths, maxEventsPerTrigger=100)
        feed.append(40, partition=0)  # the parent's last events, not read yet
        children = feed.split_method1(0)
        feed.append(200)  # to the children and partition 1
        assert sum(available_now(feedapi, server.url, paths, maxEventsPerTrigger=100)) == 240
        assert_holds(feedapi, paths[0], feed, (0, 1, *children))


def test_a_method_2_split_during_a_stream_continues_from_the_parents_cursor(feedapi, paths):
    feed = DemoFeed(partitions=2, events=300, seed=65, string_ratio=0.0)  # every payload has an id
    with DemoFeedServer(feed, dialect="published") as server:
        available_now(feedapi, server.url, paths)
        parent = feed.published(0)
        children = feed.split_method2(0)
        feed.append(200)
        assert sum(available_now(feedapi, server.url, paths)) == 200  # the history is not read twice
        stored = Counter(r.payload for r in feedapi.read.format("delta").load(paths[0]).collect())
        published = {*parent, *feed.published(1), *(e for c in children for e in feed.published(c))}
        assert set(stored) == published and set(stored.values()) == {1}


def test_an_at_least_once_feed_is_deduplicated_across_micro_batches(feedapi, paths):
    feed = DemoFeed(partitions=2, events=600, seed=66, exactly_once=False, duplicate_ratio=0.2)
    with DemoFeedServer(feed, dialect="draft") as server:
        assert len(feed.published(0)) > len(feed.expected_events(0))
        available_now(feedapi, server.url, paths, maxEventsPerTrigger=30)  # repeats cross micro-batches
        feed.append(100)
        available_now(feedapi, server.url, paths, maxEventsPerTrigger=30)
        assert_holds(feedapi, paths[0], feed, (0, 1), expected=feed.expected_events)


def test_through_spark_connect(connect_server, paths, feedapi):
    feed = DemoFeed(partitions=2, events=300, seed=67)
    with DemoFeedServer(feed, dialect="published") as server:
        session = f"connect:{connect_server.client_url()}"
        out = subprocess.run(
            [sys.executable, str(SCRIPT), server.url, *paths, session, "availableNow", "70"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0 and "done" in out.stdout, out.stdout + out.stderr[-4000:]
        assert_holds(feedapi, paths[0], feed, (0, 1))


def _batch_files(checkpoint: str, folder: str) -> set[int]:
    where = Path(checkpoint, folder)
    return {int(p.name) for p in where.iterdir() if p.name.isdigit()} if where.exists() else set()


def _delta_batches(table: str) -> set[int]:
    """The micro-batches Delta's streaming sink committed (the `txn` of each commit)."""
    batches = set()
    for commit in Path(table, "_delta_log").glob("*.json"):
        for line in commit.read_text().splitlines():
            if '"txn"' in line:
                batches.add(json.loads(line)["txn"]["version"])
    return batches


def test_the_query_killed_mid_batch_and_after_its_delta_commit_then_restarted_lands_every_event_once(
    feedapi, paths, tmp_path
):
    """The query's process (its own local Spark) SIGKILLed while a micro-batch runs (its offsets
    logged, not committed): the restarted query runs that micro-batch again, its rows no longer in
    the driver, so its tasks read it again from the feed, which grew meanwhile; one of those tasks'
    Python worker is SIGKILLed too. Then the state of a process killed right after Delta's commit of a
    micro-batch, before Spark's commit log entry (the entry removed after a kill): Delta's sink skips
    the micro-batch it already holds."""
    table, checkpoint = paths
    feed = DemoFeed(partitions=2, events=600, seed=68)
    with DemoFeedServer(feed, dialect="published") as server:
        command = [sys.executable, str(SCRIPT), server.url, table, checkpoint, f"classic:{tmp_path / 'spark'}"]
        output = tmp_path / "query.log"
        (tmp_path / "spark").mkdir()

        def run_until(condition) -> None:
            """The query in a process of its own (its own Spark), SIGKILLed with its Spark at `condition`."""
            with output.open("a") as log:
                process = subprocess.Popen(
                    [*command, "processingTime", "40"], stdout=log, stderr=log, start_new_session=True
                )
            try:
                wait_for(lambda: condition() or process.poll() is not None, 240)
                assert process.poll() is None, output.read_text()[-4000:]
                os.killpg(process.pid, signal.SIGKILL)
            finally:
                process.wait()

        # mid-batch: batch 3's offsets are logged, its commit is not
        run_until(lambda: 3 in _batch_files(checkpoint, "offsets"))
        logged, committed = _batch_files(checkpoint, "offsets"), _batch_files(checkpoint, "commits")
        assert max(logged) > max(committed, default=-1), "no micro-batch was under way"
        feed.append(90)

        # restarted here; the micro-batch's tasks (reading it again) are held at their first fetch
        gate = server.gate = Gate()
        writer = stream_to_delta(events(feedapi, server.url, maxEventsPerTrigger=40), table, checkpoint)
        query = writer.trigger(availableNow=True).start()
        if max(logged) not in _delta_batches(table):  # the kill came before Delta's commit
            assert gate.arrived.wait(120), "the micro-batch was not read again from the feed"
            assert kill(python_workers(os.getpid()), signal.SIGKILL), "no Python worker was reading"
            feed.append(30)  # the retried task must still read what the micro-batch read, no more
        server.gate = None
        gate.opened.set()
        assert query.awaitTermination(240) and query.exception() is None
        assert_holds(feedapi, table, feed, (0, 1))

        # killed after Delta's commit of its last micro-batch, before Spark's commit log entry
        feed.append(50)
        last = max(_batch_files(checkpoint, "offsets"))
        run_until(lambda: last + 2 in _batch_files(checkpoint, "commits"))  # the 50 events take two or more
        newest = max(_batch_files(checkpoint, "commits"))
        assert newest in _delta_batches(table)
        # what a process killed before writing the entry leaves: neither it nor its checksum (the checksum,
        # renamed after the entry, may be missing already when the kill fell between the two renames)
        Path(checkpoint, "commits", str(newest)).unlink()
        Path(checkpoint, "commits", f".{newest}.crc").unlink(missing_ok=True)
        version = max(int(p.stem) for p in Path(table, "_delta_log").glob("*.json"))
        available_now(feedapi, server.url, (table, checkpoint), maxEventsPerTrigger=40)  # runs it again
        assert max(int(p.stem) for p in Path(table, "_delta_log").glob("*.json")) == version  # skipped by Delta
        assert newest in _batch_files(checkpoint, "commits")
        assert_holds(feedapi, table, feed, (0, 1))


def test_a_query_without_a_checkpoint_starts_from_its_start_offset_and_a_bad_one_is_refused():
    """`startOffset` (what the Dagster stream passes: the table's cursor of record) is the initial offset."""
    start = {
        "partitions": {
            "0": {"cursor": "c5", "position": 5, "drained": False},
            "1": {"cursor": "c9", "position": 9, "drained": True},
        }
    }
    reader = FeedDataSource({"url": "http://127.0.0.1:9/feed", "startOffset": json.dumps(start)}).streamReader(None)
    assert reader.initialOffset() == start
    for bad in ("{not json", json.dumps({"partitions": {"0": {"position": 1}}})):
        with pytest.raises(ValueError, match="feedapi data source: bad option"):
            FeedDataSource({"url": "http://127.0.0.1:9/feed", "startOffset": bad}).streamReader(None)
