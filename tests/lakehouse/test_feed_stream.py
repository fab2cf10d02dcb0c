"""`FeedStream`: a stream whose micro-batches commit the cursor of record as the batch loads do: a feed
switched between batch loads and streams, and a stream failed at its commit, lands every event once."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.lakehouse.commit import AFTER_COMMIT, BEFORE_COMMIT
from feedapi_dagster.lakehouse.cursor_record import read_committed_state
from feedapi_dagster.lakehouse.feed_stream import FeedStream
from feedapi_dagster.lakehouse.stream_lease import LEASE_SECONDS
from feedapi_dagster.planning import PartitionState

from .conftest import source, table_rows


class Failed(Exception):
    pass


def run_stream(make_sink, server, tmp_path: Path, *, checkpoint=None, fail_at=None, limit=None, **options):
    """One availableNow query of a `FeedStream` into the test's table (`limit`: maxEventsPerTrigger); its
    query's exception (None when it ended well), and its checkpoint. `fail_at`: (moment, n): the n-th
    micro-batch fails there."""
    sink = make_sink()
    feed = source(server.url, page_size_hint=25, **options)
    checkpoint = checkpoint or str(tmp_path / f"checkpoint-{uuid.uuid4().hex[:8]}")

    seen: list[str] = []

    def on_moment(moment: str, updates: dict[int, PartitionState]) -> None:
        seen.append(moment)
        if fail_at and (moment, seen.count(moment)) == fail_at:
            raise Failed(f"failed at {moment}")

    stream = FeedStream(
        feed, sink.table, run_id="stream", checkpoint=checkpoint, on_moment=on_moment, max_events_per_trigger=limit
    )
    query = stream.start({"availableNow": True})
    try:
        assert query.awaitTermination(240), "the availableNow query did not end"
    except StreamingQueryException:  # a classic session raises the query's failure here
        pass
    return query.exception(), checkpoint


def wait_for(condition, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.3)


def stream_commits(spark, path) -> int:
    """The table's commits made by the test's streams."""
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("userMetadata").collect()
    return sum(1 for (metadata,) in history if metadata and '"run_id":"stream"' in metadata)


def assert_once(spark, path, feed, partitions, expected=None):
    for partition in partitions:
        rows = table_rows(spark, path, partition)
        assert [r.payload for r in rows] == (expected or feed.published)(partition), f"partition {partition}"
        assert [r.position for r in rows] == list(range(len(rows)))


@pytest.mark.parametrize("lakehouse", ["local", "s3"], indirect=True)
def test_batch_loads_and_streams_take_turns_on_one_cursor_of_record(
    spark, make_loader, make_sink, table_path, tmp_path
):
    feed = DemoFeed(partitions=3, events=300, seed=71)
    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server, page_size_hint=25).sync()  # batch
        feed.append(90)
        error, _ = run_stream(make_sink, server, tmp_path)  # stream: starts at the batch load's cursors
        assert error is None
        assert_once(spark, table_path, feed, range(3))
        state = read_committed_state(make_sink().table).state
        assert {p: s.position for p, s in state.partitions.items()} == {p: len(feed.published(p)) for p in range(3)}
        feed.append(60)
        reports = make_loader(server, page_size_hint=25).sync()  # batch: starts at the stream's cursors
        assert sum(r.events for r in reports.values()) == 60
        feed.append(30)
        feed.close(1)
        assert run_stream(make_sink, server, tmp_path)[0] is None
        assert_once(spark, table_path, feed, range(3))
        state = read_committed_state(make_sink().table).state
        assert state.partitions[1].drained  # a closed partition read to its end, as a batch load says it
        assert sum(r.events for r in make_loader(server, page_size_hint=25).sync().values()) == 0


def test_an_at_least_once_feed_switched_between_modes_keeps_no_repeat(
    spark, make_loader, make_sink, table_path, tmp_path
):
    feed = DemoFeed(partitions=2, events=400, seed=72, exactly_once=False, duplicate_ratio=0.2)
    with DemoFeedServer(feed, dialect="draft") as server:
        assert len(feed.published(0)) > len(feed.expected_events(0))
        make_loader(server, page_size_hint=25).sync()
        feed.append(80)
        assert run_stream(make_sink, server, tmp_path)[0] is None
        feed.append(80)
        make_loader(server, page_size_hint=25).sync()
        feed.append(40)
        assert run_stream(make_sink, server, tmp_path)[0] is None
        # each run's repeats of events an earlier run (of the other mode) stored are dropped
        assert_once(spark, table_path, feed, range(2), expected=feed.expected_events)


@pytest.mark.parametrize("moment", [BEFORE_COMMIT, AFTER_COMMIT])
def test_a_stream_failed_at_its_commit_loses_nothing_and_repeats_nothing(
    spark, make_loader, make_sink, table_path, tmp_path, moment, caplog
):
    feed = DemoFeed(partitions=2, events=200, seed=73)
    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server, page_size_hint=25).sync()
        feed.append(100)
        # micro-batches of 50 events at most (2 pages of each partition): the second one fails
        error, checkpoint = run_stream(make_sink, server, tmp_path, fail_at=(moment, 2), limit=50)
        assert error is not None and f"failed at {moment}" in str(error)
        # the first micro-batch's commit, and the failed one's when it failed after it
        assert stream_commits(spark, table_path) == (1 if moment == BEFORE_COMMIT else 2)
        # the same query again from its checkpoint: Spark runs the failed micro-batch again
        with caplog.at_level("INFO", logger="feedapi_dagster.lakehouse.feed_stream"):
            assert run_stream(make_sink, server, tmp_path, checkpoint=checkpoint, limit=50)[0] is None
        skipped = "is in the table already" in caplog.text
        assert skipped == (moment == AFTER_COMMIT)  # committed before the failure: not again
        assert stream_commits(spark, table_path) == 3  # the 100 events in micro-batches of 50 at most: 3
        assert_once(spark, table_path, feed, range(2))
        feed.append(20)
        # the next run: a fresh checkpoint, from the table's cursors
        assert run_stream(make_sink, server, tmp_path)[0] is None
        assert_once(spark, table_path, feed, range(2))


def test_a_stream_run_killed_on_spark_connect_stops_committing_at_its_lease_every_event_once(
    spark, connect_server, make_loader, make_sink, table_path, tmp_path
):
    """The stream as a Dagster run drives it through the embedded Spark Connect server (`foreachBatch`
    runs in the server's Python): a processingTime run's process SIGKILLed while the feed grows. Its query
    goes on in the server, but no micro-batch commits once the run's lease has expired: nothing of it
    lands later than `LEASE_SECONDS` and a commit after the kill, while events keep coming. Then an
    availableNow run continues from the table's cursor of record, and every event is in the table once."""
    feed = DemoFeed(partitions=2, events=300, seed=74)
    log = tmp_path / "runs.log"

    def command(trigger: str) -> list[str]:
        checkpoint = str(tmp_path / f"checkpoint-{trigger}")
        run = [server.url, table_path, checkpoint, connect_server.client_url(), trigger]
        return [sys.executable, "-m", "tests.lakehouse.feed_stream_run", *run]

    def rows() -> int:
        return sum(p.position for p in read_committed_state(make_sink().table).state.partitions.values())

    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server, page_size_hint=25).sync()  # a batch load first
        with log.open("a") as out:
            process = subprocess.Popen(command("processingTime"), stdout=out, stderr=out, start_new_session=True)
        try:
            for more in (40, 40, 40):
                feed.append(more)
                total = sum(len(feed.published(p)) for p in range(2))
                wait_for(lambda total=total: rows() == total or process.poll() is not None)
                assert process.poll() is None, log.read_text()[-4000:]
            os.killpg(process.pid, signal.SIGKILL)
            killed = time.time()
        finally:
            process.wait()
        # events keep coming for twice the lease: the orphan commits some until its lease expires, then none
        while time.time() < killed + 2 * LEASE_SECONDS:
            feed.append(5)
            time.sleep(1)
        orphan = [
            entry.timestamp - killed
            for entry in make_sink().table.history(None)
            if entry.user_metadata and '"run_id":"stream-processingTime"' in entry.user_metadata
        ]
        assert orphan and max(orphan) < LEASE_SECONDS + ORPHAN_COMMIT_SECONDS, orphan
        print(
            f"\nthe orphan's last commit {max(orphan):.1f} s after the kill ({len([t for t in orphan if t > 0])} after it)"
        )
        assert rows() < sum(len(feed.published(p)) for p in range(2))  # it stopped committing
        run = subprocess.run(command("availableNow"), capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and "done" in run.stdout, run.stdout + run.stderr[-4000:]
        assert_once(spark, table_path, feed, range(2))
        assert rows() == sum(len(feed.published(p)) for p in range(2))


# what one micro-batch's commit, begun just before the lease expired, may take to land (a few hundred
# milliseconds here; room for a slow CI machine)
ORPHAN_COMMIT_SECONDS = 5.0
