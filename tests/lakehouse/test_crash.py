"""Loads killed at their dangerous moments, then resumed: nothing lost, nothing twice.

* the run process (the Spark driver's client), SIGKILLed after Spark read the feed, right before
  and right after the Delta commit, on local disk and on S3, reading a FeedAPI feed or a Nakadi
  event type (over wire faults, with Nakadi's repeated events);
* the run process SIGKILLed while its Delta write uploads the data files to S3, and after they are
  uploaded but before the commit file is (the S3 server holds the uploads): whatever the Spark
  server then does with the dead client's write, the next load lands every event once;
* a Python worker SIGKILLed in the middle of a read task (Spark retries the task; the feed grows
  between the two attempts, so they read different amounts; the load's count of payloads Spark could
  not parse is of the kept attempt's rows, not of the killed one's too);
* the Spark Connect server SIGKILLed in the middle of a read, and SIGSTOPped (the load ends with
  `SparkUnresponsive` after its bound, instead of waiting for ever).
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from feedapi_dagster.demo import DemoFeed, DemoFeedServer, Faults, Gate, NakadiDemoServer, NakadiEventType
from feedapi_dagster.lakehouse.cursor_record import read_committed_state, read_history
from feedapi_dagster.lakehouse.load_settings import LoadSettings
from feedapi_dagster.lakehouse.loader import FeedLoader
from feedapi_dagster.protocol import FeedSettings, RetryPolicy, feed_settings
from tests.conftest import TEST_SERVER_CONF

from ..spark_processes import kill, python_workers
from .conftest import (
    add_odd_events,
    assert_columns_are_the_payload,
    assert_data_is_the_payload,
    table_rows,
    unparsed_rows,
)

SCRIPT = Path(__file__).with_name("load_and_die.py")


def load_command(server, table_path: str, moment: str, connect_url: str, lakehouse) -> list[str]:
    storage = [lakehouse.storage.model_dump_json()] if lakehouse.on_s3 else []
    feed = server.url if isinstance(server, DemoFeedServer) else nakadi_feed(server).model_dump_json()
    return [sys.executable, str(SCRIPT), feed, table_path, moment, connect_url, *storage]


def kill_a_load(spark, server, feed, table_path: str, moment: str, generation: int, connect_server, lakehouse) -> None:
    """Syncs in `load_and_die.py`, SIGKILLed the second time they reach `moment`: the table then holds
    the state of commit `generation` and exactly the rows its cursors cover, some of the feed's events."""
    process = subprocess.run(
        load_command(server, table_path, moment, connect_server.client_url(), lakehouse),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == -signal.SIGKILL, process.stdout + process.stderr[-3000:]
    # a streamed load's rows commit holds the ends of its partitions in its rows: whether the load was
    # killed right after it (`rows_committed`) or not, its state is that commit's
    died = read_committed_state(lakehouse.feed_table(spark, table_path))
    assert died.state.generation == generation
    assert died.source == "commit"
    stored = sum(state.position for state in died.state.partitions.values())
    assert 0 < stored < sum(len(feed.expected_events(p)) for p in (0, 1))
    assert spark.read.format("delta").load(table_path).count() == stored  # rows match the cursors


def nakadi_feed(server: NakadiDemoServer) -> FeedSettings:
    return feed_settings(
        url=server.url,
        protocol="nakadi",
        event_type=server.event_type.name,
        retry=RetryPolicy(max_attempts=30, base_delay=0.001, max_delay=0.01),
    )


@pytest.mark.parametrize(
    "moment, generation, lakehouse, payload_form",
    [
        ("before_commit", 1, "local", "json"),
        ("rows_committed", 2, "local", "json"),
        ("after_commit", 2, "local", "json"),
        ("rows_committed", 2, "s3", "json"),
        # the payload parsed into `data` by the same Spark job (`FeedTable.write`), through Spark Connect
        ("rows_committed", 2, "local", "variant"),
        # typed columns: the read kept, its columns planned and written with the rows in one commit
        ("before_commit", 1, "local", "columns"),
    ],
    indirect=["lakehouse"],
)
def test_sigkill_of_a_streamed_load_then_resume_loads_every_event_exactly_once(
    spark, connect_server, make_loader, lakehouse, table_path, moment, generation, payload_form
):
    # An exactly-once feed: each load is one Spark job that reads and commits the rows, then the state
    # commit. Killed before the job, between the two commits, or after both, in the second of its loads.
    feed = DemoFeed(partitions=2, events=600, seed=20)
    if payload_form != "json":  # the table made in this form; the loads (given no form) write the table's
        lakehouse.feed_table(spark, table_path, payload_form=payload_form).ensure_table()
    with DemoFeedServer(feed, dialect="published") as server:
        kill_a_load(spark, server, feed, table_path, moment, generation, connect_server, lakehouse)
        feed.append(50)  # the feed moves on while the loader is down
        unparseable = add_odd_events(feed, partition=1)
        resumed = make_loader(server).sync()
    assert_every_event_once(spark, table_path, feed, exactly_once=True, log=lakehouse.log(table_path))
    if payload_form == "variant":
        assert assert_data_is_the_payload(spark, table_path, unparseable) == sum(len(feed.published(p)) for p in (0, 1))
        # the load that resumed counted the payloads Spark could not parse of the rows it committed: they
        # are all the table has (the killed load's rows had none)
        assert unparsed_rows(spark, table_path) == {1: len(unparseable)}
        assert {pid: report.unparsed_payloads for pid, report in resumed.items()} == {0: 0, 1: len(unparseable)}
    if payload_form == "columns":
        assert assert_columns_are_the_payload(spark, table_path, unparseable) == {}
        assert {pid: report.unparsed_payloads for pid, report in resumed.items()} == {0: 0, 1: len(unparseable)}


@pytest.mark.parametrize("lakehouse", ["local"], indirect=True)
def test_sigkill_between_a_rows_commit_and_the_state_commit_its_rows_cannot_say(
    spark, connect_server, make_loader, lakehouse, table_path
):
    # Partition 1 is closed with 150 events: the second wave of reads (100 events a partition each)
    # drains it, which its rows cannot say (a state commit follows its rows commit); the load is killed
    # between the two. (Not partition 0: a closed partition 0 makes the others its method-1 children,
    # as feedapi-go leaves their parent out.)
    feed = DemoFeed(partitions=2, events=0, seed=22)
    feed.append(150, partition=1)
    feed.append(300, partition=0)
    feed.close(1)
    with DemoFeedServer(feed, dialect="published") as server:
        kill_a_load(spark, server, feed, table_path, "rows_committed", 2, connect_server, lakehouse)
        newest = read_history(table_path).states[0]
        assert newest.pending == (0, 1)  # the rows commit is the newest state: no state commit landed
        died = read_committed_state(table_path)
        assert died.state.get(1).position == 150 and not died.state.get(1).drained
        feed.append(50, partition=0)
        resumed = make_loader(server).sync()
    assert resumed[1].events == 0 and resumed[1].drained  # read again from its newest row: nothing, drained
    assert read_committed_state(table_path).state.get(1).drained
    assert_every_event_once(spark, table_path, feed, exactly_once=True, log=lakehouse.log(table_path))


@pytest.mark.parametrize(
    "moment, generation, lakehouse",
    [
        # an at-least-once feed: its first wave streamed, the next ones deduplicated against the table
        # through a kept read (`read`: killed with the read kept, before its commit)
        ("read", 2, "local"),
        ("before_commit", 1, "local"),
        ("after_commit", 2, "local"),
        ("after_commit", 2, "s3"),  # on S3, the moments of its own uploads are the test below
    ],
    indirect=["lakehouse"],
)
def test_sigkill_of_the_run_then_resume_loads_every_event_exactly_once(
    spark, connect_server, make_loader, lakehouse, table_path, moment, generation
):
    feed = DemoFeed(partitions=2, events=600, seed=21, exactly_once=False, duplicate_ratio=0.1)
    with DemoFeedServer(feed, dialect="draft") as server:
        kill_a_load(spark, server, feed, table_path, moment, generation, connect_server, lakehouse)
        feed.append(50)  # the feed moves on while the loader is down
        make_loader(server).sync()
    assert_every_event_once(spark, table_path, feed, log=lakehouse.log(table_path))


@pytest.mark.parametrize("moment, generation", [("before_commit", 1), ("after_commit", 2)])
def test_a_nakadi_load_sigkilled_at_its_commit_then_resumed_lands_every_event_once(
    spark, connect_server, make_sink, lakehouse, table_path, moment, generation
):
    """A Nakadi event type (at least once: repeated eids) over faults; the load is killed right before
    or right after a commit, then the feed moves on and a resume loads the rest."""
    event_type = NakadiEventType(partitions=2, events=600, seed=22, duplicate_ratio=0.1)
    with NakadiDemoServer(event_type, faults=Faults(0.2, seed=2, retry_after=0)) as server:
        kill_a_load(spark, server, event_type, table_path, moment, generation, connect_server, lakehouse)
        event_type.append(50)
        FeedLoader(nakadi_feed(server), make_sink()).sync()
        assert server.fault_counts
    assert_every_event_once(spark, table_path, event_type, log=lakehouse.log(table_path))


@pytest.mark.parametrize("lakehouse", ["s3"], indirect=True)
@pytest.mark.parametrize("held", ["/part-", "/_delta_log/0"], ids=["during-the-write", "before-the-commit-file"])
def test_sigkill_of_the_run_while_its_delta_write_uploads_to_s3_lands_every_event_once(
    spark, connect_server, s3_server, lakehouse, table_path, held
):
    feed = DemoFeed(partitions=2, events=300, seed=24)
    connect_url = connect_server.client_url()
    with DemoFeedServer(feed, dialect="published") as server:
        first = subprocess.run(
            load_command(server, table_path, "none", connect_url, lakehouse),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert first.returncode == 0, first.stderr[-3000:]
        before = read_committed_state(lakehouse.log(table_path))
        feed.append(100)
        s3_server.hold_uploads(held)  # the next write's data files, or its commit file
        try:
            load = subprocess.Popen(
                load_command(server, table_path, "none", connect_url, lakehouse),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            deadline = time.monotonic() + 240
            while s3_server.held_uploads() == 0:
                assert load.poll() is None and time.monotonic() < deadline, "the write never uploaded"
                time.sleep(0.2)
            load.kill()  # the run dies with its write half done
            load.communicate(timeout=60)
            assert read_committed_state(lakehouse.log(table_path)) == before
        finally:
            s3_server.release_uploads()
        # the server goes on with the dead client's write (or drops it): once it is done, the next load,
        # through the same Spark driver, goes on from whatever landed
        _wait_until_the_version_settles(lakehouse.log(table_path))
        feed.append(30)
        again = subprocess.run(
            load_command(server, table_path, "none", connect_url, lakehouse),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert again.returncode == 0, again.stderr[-3000:]
        assert read_committed_state(lakehouse.log(table_path)).state.generation >= before.state.generation + 1
    assert_every_event_once(spark, table_path, feed, exactly_once=True, log=lakehouse.log(table_path))


def _wait_until_the_version_settles(log, quiet_seconds: float = 5, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    version, since = None, time.monotonic()
    while time.monotonic() < deadline:
        now = read_history(log).table_version
        if now != version:
            version, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_seconds:
            return
        time.sleep(0.5)
    pytest.fail("the table's version kept moving")


def test_a_python_worker_killed_mid_read_is_retried_and_its_read_lands_once(spark, make_loader, table_path):
    # One read task reads both partitions of a variant table: partition 0's rows, two of them payloads
    # Spark cannot parse, go into the Delta write while partition 1's read is held; the worker is killed
    # and Spark runs the task again. The count of unparsed payloads is of the attempt Spark kept only.
    feed = DemoFeed(partitions=2, events=300, seed=22)
    one_task = LoadSettings(read_tasks=1)
    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server, payload_form="variant", settings=one_task).sync()
        feed.append(100)
        unparseable = add_odd_events(feed, partition=0)
        gate = server.gate = Gate(partition=1)
        outcome = {}
        load = threading.Thread(target=lambda: outcome.update(reports=make_loader(server, settings=one_task).sync()))
        load.start()
        assert gate.arrived.wait(120), "the read tasks never fetched"
        time.sleep(1)  # partition 0's pages on their way into the write
        killed = kill(python_workers(os.getpid()), signal.SIGKILL)
        assert killed, "no Python worker was reading"
        feed.append(70)  # the retried task reads more than the killed one had
        server.gate = None
        gate.opened.set()
        load.join(300)
        assert outcome["reports"][0].status == "loaded"
    assert_every_event_once(spark, table_path, feed, exactly_once=True)
    assert assert_data_is_the_payload(spark, table_path, unparseable) == sum(len(feed.published(p)) for p in (0, 1))
    assert unparsed_rows(spark, table_path) == {0: len(unparseable)}
    assert {pid: report.unparsed_payloads for pid, report in outcome["reports"].items()} == {0: len(unparseable), 1: 0}


def test_the_spark_connect_server_killed_mid_read_commits_nothing_then_resume(spark, make_loader, table_path, tmp_path):
    from feedapi_dagster.spark.embedded import start_embedded_server
    from tests.ports import find_free_port

    feed = DemoFeed(partitions=2, events=300, seed=23)
    port = find_free_port()
    spark_server = start_embedded_server(port, work_dir=tmp_path / "doomed-server", conf=TEST_SERVER_CONF)
    try:
        with DemoFeedServer(feed, dialect="published") as server:
            before, gate, process = _a_load_caught_reading(server, feed, make_loader, table_path, spark_server)
            os.killpg(spark_server.pid, signal.SIGKILL)
            server.gate = None
            gate.opened.set()
            # the client waits up to 10 minutes for a server that went away; one that comes back
            # has lost the client's session and the run's query with it: the run fails
            spark_server.stop()
            spark_server = start_embedded_server(port, work_dir=tmp_path / "restarted-server", conf=TEST_SERVER_CONF)
            out, err = process.communicate(timeout=300)
            assert process.returncode not in (0, -signal.SIGKILL), out + err[-3000:]
            assert read_committed_state(table_path) == before
            make_loader(server).sync()
    finally:
        spark_server.stop()
    assert_every_event_once(spark, table_path, feed, exactly_once=True)


def test_a_stopped_spark_connect_server_ends_the_load_with_a_clear_error_not_a_hang(
    spark, make_loader, table_path, tmp_path
):
    # The server's processes SIGSTOPped while the load's read tasks wait for a page: no call of the
    # load ever returns. The load's watchdog gives up after its bound, the load fails saying why, and
    # its process ends (a Dagster run's slot is freed). Nothing was committed meanwhile; the next load
    # goes on, every event once.
    from feedapi_dagster.spark.embedded import start_embedded_server
    from tests.ports import find_free_port

    feed = DemoFeed(partitions=2, events=300, seed=24)
    spark_server = start_embedded_server(find_free_port(), work_dir=tmp_path / "stopped-server", conf=TEST_SERVER_CONF)
    try:
        with DemoFeedServer(feed, dialect="published") as server:
            before, gate, process = _a_load_caught_reading(
                server, feed, make_loader, table_path, spark_server, UNRESPONSIVE_SECONDS="10"
            )
            os.killpg(spark_server.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            try:
                server.gate = None
                gate.opened.set()
                out, err = process.communicate(timeout=120)
                ended_after = time.monotonic() - stopped
                while_stopped = read_committed_state(table_path)
            finally:
                os.killpg(spark_server.pid, signal.SIGCONT)
            assert process.returncode not in (0, -signal.SIGKILL), out + err[-3000:]
            assert "SparkUnresponsive: the load of feed" in err and "did not answer for" in err, err[-3000:]
            assert ended_after < 60, ended_after  # the bound (10 s), a probe interval, the exit
            assert while_stopped == before
            # woken up, the server may finish the abandoned load's job and land its rows commit (whole,
            # without its state commit: the cursors are then read from its rows); the next load goes on
            # from whatever landed
            _wait_until_the_version_settles(table_path)
            make_loader(server).sync()
    finally:
        spark_server.stop()
    assert_every_event_once(spark, table_path, feed, exactly_once=True)


def _a_load_caught_reading(server, feed, make_loader, table_path, spark_server, **env):
    """A first load, then the feed grows and a load in its own process (`load_and_die.py`, through
    `spark_server`, `env` added to its environment) is held by the feed server's gate while its read
    tasks fetch: the state before it, the gate and the process."""
    make_loader(server).sync()
    before = read_committed_state(table_path)
    feed.append(100)
    gate = server.gate = Gate()
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), server.url, table_path, "none", spark_server.client_url()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    _wait_for_fetch(gate, process)
    return before, gate, process


def _wait_for_fetch(gate: Gate, process: subprocess.Popen, timeout: float = 240) -> None:
    """Until the load process's read tasks fetch from the feed; its output when it ends or hangs first
    (a new server's first read registers the data source and starts its Python workers: slow on a
    busy machine)."""
    deadline = time.monotonic() + timeout
    while not gate.arrived.wait(1):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            out, err = process.communicate()
            pytest.fail(
                f"the read tasks never fetched (load process: exit code {process.returncode}):\n"
                f"{out[-2000:]}\n{err[-6000:]}"
            )


def assert_every_event_once(spark, table_path, feed, exactly_once=False, log=None):
    """`log`: the table's `DeltaLog` (a table on S3); `table_path` read with delta-rs by default."""
    for partition in (0, 1):
        rows = table_rows(spark, table_path, partition)
        expected = feed.published(partition) if exactly_once else feed.expected_events(partition)
        assert [r.payload for r in rows] == expected
        assert [r.position for r in rows] == list(range(len(rows)))
        assert read_committed_state(log or table_path).state.get(partition).position == len(rows)
