"""A stream run killed as a deployment loses it: its query stops committing at its lease, and the feed's
next runs go on without a failure.

Through `dagster-webserver` and `dagster-daemon` on the shipped dagster.yaml, the feed's schedule on
(every minute), the embedded Spark Connect server: a `processing_time` stream run of `orders` streams
while events are published; its run worker and the code server that started it are SIGKILLed together.
Its query goes on in the Spark server, but commits nothing once the run's lease has expired. A new
stream run is launched at once, the schedule's batch loads go on ticking: each waits for the feed's pool
until the stalled-loads sensor has failed the dead run, and none may fail. The dead run's page says what
became of its query; every event is in the table once."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import dagster as dg
import pytest
from dagster._core.instance.ref import InstanceRef
from deltalake import DeltaTable

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.lakehouse.delta_log import DeltaLog
from feedapi_dagster.lakehouse.stream_lease import LEASE_SECONDS
from tests.ports import find_free_port

from ..backfills import running_daemon
from ..lakehouse.test_feed_stream import ORPHAN_COMMIT_SECONDS
from ..user_project import write_user_project
from .test_stalled_loads import (
    _graphql,
    _messages,
    _parent,
    _wait,
    _worker_pid,
    quick_monitoring_home,
    running_webserver,
)

LAUNCH = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""
STREAM_OP = "feedapi_orders_stream_op"


def _launch_stream(port: int, **config) -> str:
    params = {
        "selector": {
            "repositoryLocationName": "user",
            "repositoryName": "__repository__",
            "jobName": "feedapi_orders_stream",
        },
        "runConfigData": {"ops": {STREAM_OP: {"config": config}}},
    }
    answer = _graphql(port, LAUNCH, {"params": params})
    launched = answer["data"]["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", answer
    return launched["run"]["runId"]


@pytest.mark.spark
@pytest.mark.parametrize("after_the_kill", ["publishing", "idle"])
def test_a_killed_stream_runs_query_stops_at_its_lease_and_the_feeds_runs_go_on(
    tmp_path, connect_server, after_the_kill
):
    """`publishing`: events keep coming, the orphan's micro-batches run and stop at its lease. `idle`:
    nothing is published until the dead run has been failed: the orphan runs no micro-batch (no lease is
    checked) and is stopped by the first of the feed's runs or sensor ticks that looks."""
    home = quick_monitoring_home(tmp_path)
    logs = [tmp_path / "daemon.log", tmp_path / "webserver.log"]
    feed = DemoFeed(partitions=2, events=200, seed=47)
    stop_publishing = threading.Event()
    paused = threading.Event()

    def publish() -> None:
        while not stop_publishing.wait(0.5):
            if not paused.is_set():
                feed.append(4)

    with (
        DemoFeedServer(feed, dialect="published") as server,
        dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance,
    ):
        schedule = {"enabled": True, "cron": "* * * * *", "discovery_enabled": False, "stalled_load_seconds": 30}
        project = write_user_project(
            tmp_path / "project",
            server.url,
            {"mode": "embedded", "port": connect_server.port},  # the tests' shared server
            lakehouse=tmp_path / "lakehouse",
            feed={"schedule": schedule},
        )
        instance.add_dynamic_partitions("feedapi_orders", ["0", "1"])
        port = find_free_port()
        publisher = threading.Thread(target=publish)
        with running_daemon(project, home, logs[0]), running_webserver(project, home, port, logs[1]):
            publisher.start()
            try:
                dead = _launch_stream(port, trigger="processing_time", interval_seconds=1)

                def micro_batches_committed() -> bool:
                    said = _messages(instance, dead)
                    return len([m for m in said if re.match(r"feed orders: committed \d+ events", m)]) >= 2

                _wait("the stream's micro-batches", micro_batches_committed, 240, logs)
                if after_the_kill == "idle":
                    paused.set()
                    time.sleep(5)  # the query's last micro-batches of what was published
                worker = _wait("the worker's pid in its log", lambda: _worker_pid(instance, dead), 30, logs)
                code_server = _parent(worker)
                os.kill(worker, signal.SIGKILL)
                os.kill(code_server, signal.SIGKILL)
                killed = time.time()
                # at once: a new stream run (the schedule's loads tick on their own, every minute)
                following = _launch_stream(port, trigger="processing_time", interval_seconds=1, run_seconds=15)
                if after_the_kill == "idle":
                    failed = lambda: instance.get_run_by_id(dead).status == dg.DagsterRunStatus.FAILURE  # noqa: E731
                    _wait("the dead run failed", failed, 180, logs)
                    time.sleep(5)
                    paused.clear()
                _wait("the new stream run", lambda: instance.get_run_by_id(following).is_finished, 300, logs)
                recovered_after = time.time() - killed

                def scheduled_load_after_the_kill() -> bool:
                    loads = instance.get_run_records(dg.RunsFilter(tags={"feedapi/sync": "schedule"}))
                    return any(r.create_timestamp.timestamp() > killed and r.dagster_run.is_finished for r in loads)

                _wait("a scheduled load after the kill", scheduled_load_after_the_kill, 240, logs)
            finally:
                stop_publishing.set()
                publisher.join()
            last = _launch_stream(port)  # available_now: what the feed holds now
            _wait("the last stream run", lambda: instance.get_run_by_id(last).is_finished, 240, logs)
            # the schedule's loads launched meanwhile end too (the daemon stops at the end of the block)
            _wait("every run", lambda: all(run.is_finished for run in instance.get_runs()), 240, logs)

        runs = {run.run_id: run for run in instance.get_runs()}
        assert runs[dead].status == dg.DagsterRunStatus.FAILURE
        failed = {
            run_id: _messages(instance, run_id)[-5:]
            for run_id, run in runs.items()
            if run_id != dead and not run.is_success
        }
        assert not failed, failed
        said = _messages(instance, dead)
        (cleared,) = [m for m in said if f"run {dead}" in m and "after its run ended" in m]
        # the lease expires before Dagster's run monitoring marks the run failed: either can be seen first
        assert re.fullmatch(
            rf"feed orders: (stopped the stream query that run {dead} left running|the stream query of run {dead} "
            r"had stopped) \((FAILURE|STARTED) in Dagster, its lease last renewed at \d\d:\d\d:\d\d UTC\): it committed \d+ "
            r"micro-batch(es)? after its run ended",
            cleared,
        ), cleared
        if after_the_kill == "idle":  # the orphan ran no micro-batch: it was still running, and was stopped
            assert cleared.startswith(f"feed orders: stopped the stream query that run {dead} left running"), cleared
        table = str(tmp_path / "lakehouse" / "orders")
        orphan = [
            entry.timestamp - killed
            for entry in DeltaLog(table).history(None)
            if entry.user_metadata and f'"run_id":"{dead}"' in entry.user_metadata and entry.timestamp is not None
        ]
        assert max(orphan) < LEASE_SECONDS + ORPHAN_COMMIT_SECONDS, orphan
        rows = DeltaTable(table).to_pyarrow_table(columns=["partition_id", "position", "payload"]).to_pylist()
        for partition in range(2):
            mine = sorted((r["position"], r["payload"]) for r in rows if r["partition_id"] == partition)
            assert [position for position, _ in mine] == list(range(len(mine)))
            assert [payload for _, payload in mine] == feed.published(partition)
        print(
            f"\nthe dead run's last commit {max(orphan):.1f} s after the kill "
            f"({len([t for t in orphan if t > 0])} after it); the new stream run ended {recovered_after:.0f} s "
            f"after the kill; {cleared}"
        )
