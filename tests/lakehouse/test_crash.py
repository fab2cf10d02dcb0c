"""kill -9 of a load process at the dangerous moments, then a resume: nothing lost, nothing twice."""
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.lakehouse.state import read_committed_state

from .conftest import table_rows

SCRIPT = Path(__file__).with_name("load_and_die.py")


MOMENTS = pytest.mark.parametrize("moment, commits_before_death", [("before_commit", 1), ("after_commit", 2)])


@MOMENTS
def test_sigkill_then_resume_loads_every_event_exactly_once(spark, connect_server, writer, make_loader, table_path,
                                                             moment, commits_before_death):
    kill_and_resume(spark, connect_server.url if writer == "spark" else writer, make_loader, table_path, moment,
                    commits_before_death, read_processes=0)


@MOMENTS
@pytest.mark.parametrize("writer", ["deltalake"], indirect=True)
def test_sigkill_with_reader_processes_then_resume_loads_every_event_exactly_once(
        spark, writer, make_loader, table_path, moment, commits_before_death):
    # the reader processes must stop on their own when the load process is killed
    kill_and_resume(spark, writer, make_loader, table_path, moment, commits_before_death, read_processes=2)


def kill_and_resume(spark, writer, make_loader, table_path, moment, commits_before_death, read_processes):
    feed = DemoFeed(partitions=2, events=600, seed=21, exactly_once=False, duplicate_ratio=0.1)
    with DemoFeedServer(feed, dialect="draft") as server:
        process = subprocess.run(
            [sys.executable, str(SCRIPT), server.url, table_path, moment, writer, "100", str(read_processes)],
            capture_output=True, text=True, timeout=300)
        assert process.returncode == -signal.SIGKILL, process.stdout + process.stderr[-3000:]
        died = read_committed_state(table_path)
        assert died.state.generation == commits_before_death
        stored = sum(state.position for state in died.state.partitions.values())
        assert spark.read.format("delta").load(table_path).count() == stored  # rows match the cursors
        feed.append(50)  # the feed moves on while the loader is down
        make_loader(server).sync()
    for partition in (0, 1):
        rows = table_rows(spark, table_path, partition)
        assert [r.payload for r in rows] == feed.expected_events(partition)
        assert [r.position for r in rows] == list(range(len(rows)))
