"""The Delta sink with real Spark, real Delta and real HTTP against the demo server."""

import json
import threading
from pathlib import Path

import pytest
from deltalake import DeltaTable

from feedapi_dagster.demo import DemoFeed, DemoFeedServer, Faults
from feedapi_dagster.errors import PartitionConflict, RebuildAbandoned
from feedapi_dagster.lakehouse.cursor_record import read_committed_state
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.lakehouse.load_settings import LoadSettings
from feedapi_dagster.planning import PartitionState
from feedapi_dagster.protocol import EventFilter

from .conftest import LOG_READERS, payloads, table_rows

ODD_PAYLOADS = [
    '{"id":"u1","text":"Grüße 日本 🎉 \\ud83d\\ude00","esc":"\\"q\\" \\\\ \\n \\u0000 \\/"}',
    '{"id":"u2","nested":{"a":[1,{"b":{"c":[true,false,null]}}],"n":1.0,"e":1e3,"big":12345678901234567890}}',
    '{ "id" : "u3" ,  "spaced" : [ 1 , 2 ] }',
    '"a plain string with \\"escapes\\" and \\u00e9 and \\ud83d\\ude00"',
    '[1,"two",{"three":3}]',
    "42.50",
    "true",
    "null",
    '{"no_id":1}',
    '{"id":7,"numeric":"id"}',
]


def test_every_payload_kind_round_trips_byte_for_byte(spark, make_loader, table_path):
    feed = DemoFeed(partitions=1, events=20, seed=1)
    for text in ODD_PAYLOADS:
        feed.add_event(text, partition=0)
    big = '{"id":"big","blob":"' + "ü" * (3 * 1024 * 1024) + '"}'
    feed.add_event(big, partition=0)
    with DemoFeedServer(feed, dialect="draft") as server:
        make_loader(server, page_size_hint=7).sync()
    rows = table_rows(spark, table_path, 0)
    assert [r.payload for r in rows] == feed.published(0)
    assert [r.position for r in rows] == list(range(len(rows)))
    odd = {r.payload: r for r in rows[20:]}
    kinds = [odd[json.loads(t) if t.startswith('"') else t].payload_type for t in ODD_PAYLOADS]
    assert kinds == ["object", "object", "object", "string", "array", "number", "boolean", "null", "object", "object"]
    ids = [odd[json.loads(t) if t.startswith('"') else t].event_id for t in ODD_PAYLOADS]
    assert ids == ["u1", "u2", "u3", None, None, None, None, None, None, "7"]
    assert rows[-1].payload == big
    assert rows[-1].cursor == read_committed_state(table_path).state.get(0).cursor


def test_the_table_is_standard_delta_for_an_independent_reader(spark, make_loader, table_path):
    from deltalake import DeltaTable

    feed = DemoFeed(partitions=2, events=300, seed=2)
    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server).sync()
    table = DeltaTable(table_path).to_pyarrow_table().to_pylist()
    for partition in (0, 1):
        rows = sorted((r for r in table if r["partition_id"] == partition), key=lambda r: r["position"])
        assert [r["payload"] for r in rows] == feed.published(partition)
    # a new table is clustered by partition_id, not partitioned (`test_layout.py`)
    assert DeltaTable(table_path).metadata().partition_columns == []


@LOG_READERS
def test_at_least_once_feeds_are_deduplicated_across_loads(spark, make_loader, table_path):
    feed = DemoFeed(partitions=2, events=400, seed=3, exactly_once=False, duplicate_ratio=0.2)
    with DemoFeedServer(feed, dialect="draft", faults=Faults(rate=0.2, seed=3, retry_after=0)) as server:
        loader = make_loader(server, page_size_hint=25)
        first = loader.sync()
        assert sum(r.duplicates for r in first.values()) > 0
        # republish already loaded events: the same ids again, later in the partition
        for text in feed.published(0)[:30]:
            if text.startswith("{"):
                feed.add_event(text, partition=0)
        feed.append(40)
        loader.sync()
    for partition in (0, 1):
        rows = table_rows(spark, table_path, partition)
        assert [r.payload for r in rows] == feed.expected_events(partition)
        assert [r.position for r in rows] == list(range(len(rows)))
        ids = [r.event_id for r in rows if r.event_id is not None]
        assert len(ids) == len(set(ids))


def test_cursor_only_pages_advance_the_stored_cursor(spark, make_loader, table_path):
    feed = DemoFeed(partitions=1, events=200, seed=4, string_ratio=0)
    with DemoFeedServer(feed, dialect="draft") as server:
        loader = make_loader(server, filters=EventFilter(fields={"type": "order.paid"}), page_size_hint=10)
        loader.sync()
        state = read_committed_state(table_path).state.get(0)
        rows = table_rows(spark, table_path, 0)
        assert [json.loads(r.payload)["type"] for r in rows] == ["order.paid"] * len(rows)
        # the cursor covers the whole partition, also past the last matching event
        last_seq = max(json.loads(p)["seq"] for p in feed.published(0))
        assert state.cursor == f"c{last_seq:012x}"
        assert state.cursor != rows[-1].cursor or json.loads(rows[-1].payload)["seq"] == last_seq
    # the rows alone cannot say that cursor: the rows commit (version 1) is followed by a state commit
    assert DeltaTable(table_path).version() == 2 and not read_committed_state(table_path).ends_from_rows


def test_a_sync_whose_rows_hold_its_cursors_is_one_commit_and_a_drained_partition_takes_a_state_commit(
    spark, make_loader, table_path
):
    feed = DemoFeed(partitions=2, events=300, seed=6)
    with DemoFeedServer(feed, dialect="published") as server:
        loader = make_loader(server, page_size_hint=40)
        loader.sync()
        # each read ended after a page of events: its rows commit (version 1, after the table's creation)
        # is the load's only commit, and the state it carries ends each partition at its newest row
        one = read_committed_state(table_path)
        assert (DeltaTable(table_path).version(), one.delta_version, one.ends_from_rows) == (1, 1, (0, 1))
        for partition in (0, 1):
            rows = table_rows(spark, table_path, partition)
            assert [r.payload for r in rows] == feed.published(partition)
            assert one.state.get(partition) == PartitionState(cursor=rows[-1].cursor, position=len(rows))
        # read through Spark's session too (the table as a `FeedTable`): the same state
        assert read_committed_state(FeedTable(spark, table_path)).state == one.state
        feed.append(30)
        feed.close(1)
        make_loader(server, page_size_hint=40).sync()  # a new run: it discovers partition 1 closed
    # partition 1 drained, which its rows cannot say: a state commit follows the rows commit
    two = read_committed_state(table_path)
    assert (DeltaTable(table_path).version(), two.delta_version, two.ends_from_rows) == (3, 3, ())
    assert two.state.get(1).drained and not two.state.get(0).drained
    for partition in (0, 1):
        rows = table_rows(spark, table_path, partition)
        assert [r.payload for r in rows] == feed.published(partition)
        assert two.state.get(partition).position == len(rows) and two.state.get(partition).cursor == rows[-1].cursor


def test_closed_partition_is_drained_and_not_read_again(spark, make_loader, table_path):
    feed = DemoFeed(partitions=2, events=200, seed=5)
    feed.close(1)
    with DemoFeedServer(feed, dialect="draft") as server:
        loader = make_loader(server)
        reports = loader.sync()
        assert reports[1].drained and not reports[0].drained
        again = loader.sync()
        assert again[1].status == "drained" and again[1].events == 0
    assert payloads(spark, table_path, 1) == feed.published(1)


def test_rebuild_replaces_a_partition_in_one_commit(spark, make_loader, table_path):
    feed = DemoFeed(partitions=2, events=300, seed=6)
    with DemoFeedServer(feed, dialect="draft") as server:
        make_loader(server).sync()
        feed.close(0)
        before = read_committed_state(table_path).delta_version
        # a loader whose syncs go 40 events per partition and job: a rebuild still reads the whole
        # partition and swaps it in with one commit
        reports = make_loader(server, settings=LoadSettings(max_events_per_partition=40)).rebuild([0])
        after = read_committed_state(table_path)
        assert after.delta_version == before + 1 and reports[0].rebuilt
        assert payloads(spark, table_path, 0) == feed.published(0)
        assert payloads(spark, table_path, 1) == feed.published(1)
        for version in range(before, after.delta_version + 1):  # every version readers could see is whole
            count = (
                spark.read.format("delta")
                .option("versionAsOf", version)
                .load(table_path)
                .where("partition_id = 0")
                .count()
            )
            assert count == len(feed.published(0))
        assert after.state.get(0).position == len(feed.published(0))


def test_a_failed_rebuild_replaces_nothing(spark, make_loader, table_path):
    feed = DemoFeed(partitions=1, events=300, seed=7)
    with DemoFeedServer(feed, dialect="draft") as server:
        make_loader(server).sync()
        before = read_committed_state(table_path)
        server.faults = Faults(rate=1.0, seed=1, retry_after=0, kinds=("500",))
        from feedapi_dagster.protocol import RetryPolicy

        loader = make_loader(server, settings=None, retry=RetryPolicy(max_attempts=2, base_delay=0))
        with pytest.raises(RebuildAbandoned, match="rebuild .* abandoned, nothing replaced"):
            loader.rebuild([0])
    assert read_committed_state(table_path).delta_version == before.delta_version
    assert payloads(spark, table_path, 0) == feed.published(0)


# two loads in one Spark driver racing for one feed, on local disk and on S3 (where Delta's log store
# keeps them apart within the one driver: feedapi_dagster/spark/storage.py)
@pytest.mark.parametrize(
    "read_log, lakehouse", [("delta-rs", "local"), ("spark", "local"), ("delta-rs", "s3")], indirect=True
)
def test_concurrent_loads_of_one_partition_never_both_commit(spark, make_loader, table_path):
    feed = DemoFeed(partitions=1, events=300, seed=8)
    with DemoFeedServer(
        feed, dialect="draft", faults=Faults(rate=0.3, seed=8, retry_after=0, kinds=("slow",))
    ) as server:
        loaders = [make_loader(server) for _ in range(2)]
        outcomes = []

        def run(loader):
            try:
                outcomes.append(loader.sync())
            except PartitionConflict as conflict:
                outcomes.append(conflict)

        threads = [threading.Thread(target=run, args=(loader,)) for loader in loaders]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sum(isinstance(o, PartitionConflict) for o in outcomes) == 1
    assert payloads(spark, table_path, 0) == feed.published(0)


def test_concurrent_loads_of_different_partitions_both_commit(spark, make_loader, table_path):
    feed = DemoFeed(partitions=2, events=300, seed=9)
    with DemoFeedServer(feed, dialect="draft") as server:
        errors = []

        def run(partition):
            try:
                make_loader(server).sync([partition])
            except Exception as error:  # noqa: BLE001
                errors.append(error)

        threads = [threading.Thread(target=run, args=(p,)) for p in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors, [f"{type(error).__name__}: {error}" for error in errors]
    state = read_committed_state(table_path).state
    _assert_the_table_holds_the_feed(spark, table_path, feed)
    for partition in (0, 1):
        assert state.get(partition).position == len(feed.published(partition))


def test_a_409_mid_read_rediscovers_and_goes_on_from_the_last_page_read(spark, make_loader, table_path):
    from feedapi_dagster.demo import Gate

    feed = DemoFeed(partitions=2, events=200, seed=11)
    with DemoFeedServer(feed, dialect="published") as server:
        gate = server.gate = Gate()
        outcome = {}
        load = threading.Thread(target=lambda: outcome.update(reports=make_loader(server, page_size_hint=20).sync()))
        load.start()
        assert gate.arrived.wait(120), "the read tasks never fetched"
        server.rotate_token()  # the tasks' next fetches carry a stale discovery token: 409
        server.gate = None
        gate.opened.set()
        load.join(300)
    assert all(r.status == "loaded" for r in outcome["reports"].values())
    _assert_the_table_holds_the_feed(spark, table_path, feed)


def test_rebuilding_a_method2_child_does_not_load_its_parents_history_twice(spark, make_loader, table_path):
    # found by the long chaos run (seed 424242): the child was rebuilt from _first next to its
    # parent's rows, so the redistributed history was stored twice
    feed = DemoFeed(partitions=1, events=200, seed=12, exactly_once=False, duplicate_ratio=0.1)
    with DemoFeedServer(feed, dialect="draft") as server:
        make_loader(server).sync()
        parent_rows = payloads(spark, table_path, 0)
        children = feed.split_method2(0, children=2)
        feed.append(60)
        make_loader(server).sync()
        make_loader(server).rebuild([children[0]])
    for child in children:
        assert payloads(spark, table_path, child) == [e for e in feed.expected_events(child) if e not in parent_rows]
    ids = [r.event_id for p in (0, *children) for r in table_rows(spark, table_path, p) if r.event_id]
    assert len(ids) == len(set(ids))


def _events(partition_id: int, texts: list[str]):
    """Rows as the loader hands them to the sink: a Spark DataFrame (of the shared test session)."""
    from pyspark.sql import SparkSession

    from feedapi_dagster.read.rows import EventBatch

    batch = EventBatch()
    batch.add(partition_id, 0, [t.encode() for t in texts], [len(texts)], ["c1"])
    return SparkSession.getActiveSession().createDataFrame(batch.to_arrow())


def _rows(partition_id: int, texts: list[str]):
    """What a sink commits: a function giving the rows of each attempt."""
    return lambda: _events(partition_id, texts)


@LOG_READERS
def test_a_writer_with_a_stale_state_rebases_or_refuses_never_overwrites(spark, make_sink, table_path):
    # Two sinks read the (empty) state; the first commits. The second still holds the old state (and,
    # for delta-rs, the old table snapshot): for another partition it must rebase on the first
    # commit's state, for the same partition it must refuse and commit nothing.
    from feedapi_dagster.planning import PartitionState

    first, second, third = make_sink(), make_sink(), make_sink()
    for sink in (first, second, third):
        assert sink.state.generation == 0
    advanced = PartitionState(cursor="c1", position=1)
    first.commit(_rows(0, ['{"id":"a"}']), {0: advanced}, {0: None})
    second.commit(_rows(1, ['{"id":"b"}']), {1: advanced}, {1: None})
    with pytest.raises(PartitionConflict):
        third.commit(_rows(0, ['{"id":"a"}']), {0: advanced}, {0: None})
    state = read_committed_state(table_path).state
    assert state.generation == 2 and state.get(0) == state.get(1) == advanced
    rows = spark.read.format("delta").load(table_path).orderBy("partition_id").collect()
    assert [(r.partition_id, r.event_id) for r in rows] == [(0, "a"), (1, "b")]


def test_sinks_whose_snapshots_were_refreshed_after_their_commits_still_never_overwrite(spark, make_sink, table_path):
    # Each sink brings its own snapshot up to date after every commit (delta-rs: in place) instead of
    # reading the table anew. Two sinks that both committed before hold refreshed snapshots; the
    # second falls behind when the first commits again, and must still rebase or refuse.
    from feedapi_dagster.planning import PartitionState

    first, second = make_sink(), make_sink()
    one, two, three = (PartitionState(cursor=f"c{n}", position=n) for n in (1, 2, 3))
    first.commit(_rows(0, ['{"id":"a"}']), {0: one}, {0: None})
    second.commit(_rows(1, ['{"id":"b"}']), {1: one}, {1: None})  # rebased on the first commit
    first.commit(_rows(2, ['{"id":"c"}']), {2: one}, {2: None})  # the first's snapshot is now behind
    assert second.state.generation == 2  # the second has not seen the first's new commit
    second.commit(_rows(0, ['{"id":"a2"}']), {0: two}, {0: one})  # partition 0 unchanged: rebases
    with pytest.raises(PartitionConflict):
        first.commit(_rows(0, ['{"id":"a2"}']), {0: three}, {0: one})  # partition 0 moved on: refused
    state = read_committed_state(table_path).state
    assert state.generation == 4 and (state.get(0), state.get(1), state.get(2)) == (two, one, one)
    rows = spark.read.format("delta").load(table_path).orderBy("partition_id", "event_id").collect()
    assert [(r.partition_id, r.event_id) for r in rows] == [(0, "a"), (0, "a2"), (1, "b"), (2, "c")]


@LOG_READERS
def test_a_commit_buried_under_other_writers_commits_is_still_found_landed(spark, make_sink, table_path):
    # Right after its write a sink looks for its commit among the newest few; here another writer
    # commits five times between the write and that look. The commit must still be found (not
    # rebased and written again, not refused as a conflict with itself).
    from feedapi_dagster.planning import PartitionState

    first, other = make_sink(), make_sink()
    write = first.table.write

    def write_then_others_commit(commit, run_id):
        write(commit, run_id)
        for n in range(1, 6):
            other.commit(_rows(n, [f'{{"id":"o{n}"}}']), {n: PartitionState(cursor="o", position=1)}, {n: None})

    first.table.write = write_then_others_commit
    landed = first.commit(_rows(0, ['{"id":"a"}']), {0: PartitionState(cursor="a", position=1)}, {0: None})
    assert landed.delta_version == 1 and landed.state.get(0) == PartitionState(cursor="a", position=1)
    assert read_committed_state(table_path).state.generation == 6  # its own, then the other's five
    rows = spark.read.format("delta").load(table_path).orderBy("partition_id").collect()
    assert [(r.partition_id, r.event_id) for r in rows] == [(0, "a"), *((n, f"o{n}") for n in range(1, 6))]


def test_commits_made_right_after_a_sinks_own_commit_are_rebased_on_never_overwritten(spark, make_sink, table_path):
    # Another writer commits twice right after the sink's own write: the sink's next commits must be refused for a partition the other writer moved, and
    # rebased for one it did not; neither may drop the other writer's rows or cursors.
    from feedapi_dagster.planning import PartitionState

    first, other = make_sink(), make_sink()
    write = first.table.write
    theirs = {n: PartitionState(cursor=f"o{n}", position=1) for n in (1, 2)}

    def write_then_others_commit(commit, run_id):
        write(commit, run_id)
        for n, state in theirs.items():
            other.commit(_rows(n, [f'{{"id":"o{n}"}}']), {n: state}, {n: None})

    first.table.write = write_then_others_commit
    mine = PartitionState(cursor="a", position=1)
    assert first.commit(_rows(0, ['{"id":"a"}']), {0: mine}, {0: None}).state.get(0) == mine
    first.table.write = write
    with pytest.raises(PartitionConflict):
        first.commit(_rows(1, ['{"id":"x"}']), {1: mine}, {1: None})  # partition 1 moved on: refused
    first.commit(_rows(3, ['{"id":"d"}']), {3: mine}, {3: None})  # untouched by the other: rebased
    state = read_committed_state(table_path).state
    assert state.generation == 4
    assert [state.get(n) for n in range(4)] == [mine, theirs[1], theirs[2], mine]
    assert first.state == state
    rows = spark.read.format("delta").load(table_path).orderBy("partition_id").collect()
    assert [(r.partition_id, r.event_id) for r in rows] == [(0, "a"), (1, "o1"), (2, "o2"), (3, "d")]


def test_a_rebuild_of_a_method1_child_waits_for_its_parent_to_drain(spark, make_loader, table_path):
    # found by chaos seed 777003: a rebuild loaded a method-1 child while its parent still had events
    feed = DemoFeed(partitions=2, events=200, seed=8)
    with DemoFeedServer(feed, dialect="draft") as server:
        make_loader(server).sync([0, 1])
        feed.append(20, partition=0)  # the parent has events left when it is split
        children = feed.split_method1(0, children=2)
        feed.append(40)
        before = read_committed_state(table_path).delta_version
        reports = make_loader(server).rebuild([children[0]])
        assert reports[children[0]].status == "waiting"
        assert read_committed_state(table_path).delta_version == before  # nothing committed, nothing replaced
        make_loader(server).sync([0])  # the parent drains
        assert read_committed_state(table_path).state.get(0).drained
        reports = make_loader(server).rebuild([children[0]])
        assert reports[children[0]].status == "loaded" and reports[children[0]].rebuilt
        assert payloads(spark, table_path, children[0]) == feed.published(children[0])


def test_the_delta_log_is_read_with_deltalake_where_the_run_can_open_the_table(spark, make_loader, tmp_path):
    from deltalake import DeltaTable

    from feedapi_dagster.lakehouse.delta_log import DeltaLog
    from feedapi_dagster.lakehouse.feed_table import FeedTable

    path = str(tmp_path / "feed")
    feed = DemoFeed(partitions=2, events=40, seed=3)
    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server, path=path).sync()
    by_deltalake, by_spark = FeedTable(spark, path), FeedTable(spark, path, read_log="spark")
    for table in (by_deltalake, by_spark):
        table.ensure_table()
    assert isinstance(by_deltalake.delta_log, DeltaLog)  # delta-rs reads the log
    assert isinstance(by_deltalake.delta_log.snapshot(), DeltaTable)
    assert by_spark.delta_log is None
    assert by_deltalake.history(None) == by_spark.history(None)  # the same commits, states included
    # a table delta-rs cannot open from this process stays with Spark
    assert FeedTable(spark, str(tmp_path / "not-a-table"))._open_log() is None


def test_a_delta_commit_failing_after_the_read_commits_nothing_and_leaves_nothing(
    spark, make_loader, table_path, monkeypatch
):
    # Spark has read the feed (its read tasks left their notes beside the table); the Delta write fails
    # before its commit.
    from pyspark.sql.readwriter import DataFrameWriter

    feed = DemoFeed(partitions=2, events=120, seed=4)
    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server, page_size_hint=40).sync()
        feed.append(60)
        noted: list[list[str]] = []
        real_save = DataFrameWriter.save

        def failing_save(self, path=None, *args, **kwargs):
            self._df.count()  # the write's job reads the feed (its tasks note what they read), then dies
            noted.append([p.name for p in (Path(table_path) / "_feedapi_progress").glob("load-*/*.json")])
            raise RuntimeError("the Spark job died")

        monkeypatch.setattr(DataFrameWriter, "save", failing_save)
        before = read_committed_state(table_path)
        with pytest.raises(RuntimeError, match="the Spark job died"):
            make_loader(server, page_size_hint=40).sync()
        assert len(noted) == 1 and len(noted[0]) == 2  # both read tasks were done when the write failed
        assert read_committed_state(table_path) == before
        assert not list((Path(table_path) / "_feedapi_progress").glob("load-*"))

        monkeypatch.setattr(DataFrameWriter, "save", real_save)
        make_loader(server, page_size_hint=40).sync()
    _assert_the_table_holds_the_feed(spark, table_path, feed)


def test_what_a_killed_load_leaves_is_never_committed_and_goes_after_an_hour(spark, make_loader, table_path):
    # What `kill -9` between the read and the commit leaves beside the table: its read tasks' notes
    # (the read itself was in Spark's memory). Neither Delta reader sees them, the next load commits
    # every event once, and old leftovers are removed.
    import os
    import time

    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    feed = DemoFeed(partitions=2, events=80, seed=6)
    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server).sync()
        notes = Path(table_path) / "_feedapi_progress"
        leftovers = {"load-old": time.time() - 7200, "load-recent": time.time() - 60}
        for name, mtime in leftovers.items():
            (notes / name).mkdir(parents=True)
            pq.write_table(DeltaTable(table_path).to_pyarrow_table(), notes / name / "part-0.parquet")
            (notes / name / "0.json").write_text("[]")
            os.utime(notes / name, (mtime, mtime))
        feed.append(40)
        make_loader(server).sync()
    assert sorted(p.name for p in notes.iterdir()) == ["load-recent"]  # a load may still be using it
    assert DeltaTable(table_path).to_pyarrow_table().num_rows == sum(len(feed.published(p)) for p in (0, 1))
    _assert_the_table_holds_the_feed(spark, table_path, feed)


def _assert_the_table_holds_the_feed(spark, table_path, feed, partitions=(0, 1)):
    """Every published event once, in order, in each partition."""
    for partition in partitions:
        assert payloads(spark, table_path, partition) == feed.published(partition)


def test_the_history_of_a_snapshot_numbers_each_commit_right_when_newer_ones_land(tmp_path):
    """delta-rs 1.6 lists a snapshot's history from the log's newest commit but numbers it from the
    snapshot's version: a commit landing in between had the chaos test read version 10's feed state as
    version 9's. `numbered_history` gives each commit its version and none newer than the snapshot."""
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, write_deltalake

    from feedapi_dagster.lakehouse.delta_log import numbered_history

    def commit(n: int) -> None:
        rows = pa.table({"n": pa.array([n], pa.int64())})
        write_deltalake(
            str(tmp_path), rows, mode="append", commit_properties=CommitProperties(custom_metadata={"tag": f"v{n}"})
        )

    commit(0)
    commit(1)
    latest_then = DeltaTable(str(tmp_path))  # version 1, then a commit lands before its history is read
    pinned = DeltaTable(str(tmp_path), version=0)
    commit(2)
    for snapshot, version in ((latest_then, 1), (pinned, 0)):
        for limit in (None, 1):
            listed = numbered_history(snapshot, limit)
            assert [(h["version"], h["tag"]) for h in listed][: limit or None] == [
                (v, f"v{v}") for v in range(version, -1, -1)
            ][: limit or None]
