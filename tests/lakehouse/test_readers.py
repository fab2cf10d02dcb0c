"""Reader processes (`read_processes: 2`; the default is reader threads): same rows, same cursors, and a reader that dies
mid-load fails the load without committing half of what it read."""
import multiprocessing
import os
import signal
import pytest

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.lakehouse.loader import BEFORE_COMMIT, FeedLoader, LoadSettings
from feedapi_dagster.protocol import FeedClient
from feedapi_dagster.lakehouse.state import read_committed_state

from .conftest import payloads, table_rows

PROCESSES = LoadSettings(read_processes=2, fetch_workers=4, batch_events=150)


@pytest.mark.parametrize("writer", ["deltalake"], indirect=True)
def test_reader_processes_load_dedup_and_rediscover(spark, make_loader, table_path):
    feed = DemoFeed(partitions=3, events=900, seed=31, exactly_once=False, duplicate_ratio=0.1)
    with DemoFeedServer(feed, dialect="published") as server:
        loader = make_loader(server, settings=PROCESSES, page_size_hint=40)
        first = loader.sync()
        feed.append(300)
        loader.client.discover()
        server.rotate_token()  # the readers hold a stale token: 409, rediscovery in the reader process
        second = loader.sync()
    assert all(r.status == "loaded" for r in [*first.values(), *second.values()])
    assert sum(r.duplicates for r in [*first.values(), *second.values()]) > 0
    state = read_committed_state(table_path).state
    for partition in range(3):
        rows = table_rows(spark, table_path, partition)
        assert [r.payload for r in rows] == feed.expected_events(partition)
        assert [r.position for r in rows] == list(range(len(rows)))
        assert state.get(partition).position == len(rows) and state.get(partition).cursor == rows[-1].cursor


@pytest.mark.parametrize("writer", ["deltalake"], indirect=True)
def test_a_reader_process_killed_mid_load_fails_the_load_and_a_resume_is_exact(spark, make_loader, make_sink,
                                                                               table_path):
    feed = DemoFeed(partitions=4, events=2400, seed=32)
    killed = []

    def kill_a_reader(moment, updates):
        # at the first commit: every reader is busy with partitions far from their end
        if moment == BEFORE_COMMIT and not killed:
            reader = next(p for p in multiprocessing.active_children() if p.name.startswith("feedapi-reader"))
            os.kill(reader.pid, signal.SIGKILL)
            killed.append(reader.pid)

    with DemoFeedServer(feed, dialect="draft") as server:
        loader = FeedLoader(FeedClient(server.url, page_size_hint=20), make_sink(), PROCESSES,
                            on_moment=kill_a_reader)
        with pytest.raises(RuntimeError, match=r"reader process feedapi-reader-\d died \(exit code -9\)"):
            loader.sync()
        assert killed
        died = read_committed_state(table_path).state
        stored = sum(p.position for p in died.partitions.values())
        assert 0 < stored < 2400
        assert spark.read.format("delta").load(table_path).count() == stored  # rows match the cursors
        make_loader(server, settings=PROCESSES).sync()
    for partition in range(4):
        assert payloads(spark, table_path, partition) == feed.published(partition)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("feedapi-reader")]


UNGUARDED_SCRIPT = """
import sys
from feedapi_dagster.lakehouse.loader import FeedLoader, LoadSettings
from feedapi_dagster.lakehouse.sink import DeltaSink
from feedapi_dagster.protocol import FeedClient

print("script body ran", flush=True)  # no main guard: spawned readers must not run this again
reports = FeedLoader(FeedClient(sys.argv[1]), DeltaSink(sys.argv[2]), LoadSettings(read_processes=2)).sync()
print("loaded", sum(r.events for r in reports.values()), flush=True)
"""


def test_reader_processes_do_not_rerun_the_launching_script(spark, tmp_path, table_path):
    import subprocess
    import sys

    script = tmp_path / "load.py"
    script.write_text(UNGUARDED_SCRIPT)
    feed = DemoFeed(partitions=3, events=600, seed=33)
    with DemoFeedServer(feed, dialect="draft") as server:
        done = subprocess.run([sys.executable, str(script), server.url, table_path], capture_output=True,
                              text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["script body ran", "loaded 600"]
    for partition in range(3):
        assert payloads(spark, table_path, partition) == feed.published(partition)


def test_row_groups_close_at_the_event_or_byte_bound_and_cover_every_page():
    # big events close groups by bytes, small ones by count; each group's cursor and position end
    # exactly where its rows end
    import threading

    from feedapi_dagster.lakehouse.readers import GROUP_BYTES, GROUP_EVENTS, PartitionReader
    from feedapi_dagster.planning import PartitionPlan, PlanStatus

    feed = DemoFeed(partitions=1, events=0, seed=33)
    for n in range(12):
        feed.add_event('{"id":"b%d","blob":"%s"}' % (n, "x" * 2 * 1024 * 1024), partition=0)  # 2 MiB each
    feed.append(GROUP_EVENTS * 2 + 7, partition=0)
    groups = []
    with DemoFeedServer(feed, dialect="draft") as server, FeedClient(server.url, page_size_hint=500) as client:
        reader = PartitionReader(client, PartitionPlan(partition_id=0, status=PlanStatus.DUE), 0, "id", None)
        reader.run(lambda message: groups.append(message) or True, threading.Lock())
    assert groups[-1] == ("end", 0, False)
    rows = [group for kind, _, group in groups[:-1]]
    assert all(kind == "group" for kind, _, _ in groups[:-1])
    counts = [(group.rows.num_rows, group.size) for group in rows]
    assert all(n >= GROUP_EVENTS or size >= GROUP_BYTES for n, size in counts[:-1])  # each closed at a bound
    assert counts[0][0] < 12  # the big events closed a group by bytes, long before the event bound
    positions = [row for group in rows for row in group.rows.column("position").to_pylist()]
    assert positions == list(range(len(feed.published(0))))
    for group in rows:
        assert group.position == group.rows.column("position")[-1].as_py() + 1
        assert group.cursor == group.rows.column("cursor")[-1].as_py()
    assert [p for group in rows for p in group.rows.column("payload").to_pylist()] == feed.published(0)
