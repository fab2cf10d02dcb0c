"""A load whose process is gone is failed and its pool slot freed; a slow load that is alive is not.

Through `dagster-webserver` and `dagster-daemon` on the shipped dagster.yaml (Dagster's default run
launcher, which cannot check a run worker's health): two feeds of one user project are loaded in runs
launched from the webserver, both reading slowly from throttled demo servers. The run worker of
`orders` and the daemon's code server that started it are SIGKILLed together, as a killed container
loses them: nobody is left to say the run ended. The feed's stalled-load sensor
(`schedule.stalled_load_seconds: 30` here, evaluated by the daemon on the code server it starts
again) must mark it FAILURE with its one line, run monitoring must free the feed's pool slot, and a
next load of `orders` must run and succeed. Meanwhile the load of `slow` reads for minutes, far
longer than the stall limit, its log never silent for long: it must succeed, untouched."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.instance.ref import InstanceRef

import feedapi_dagster.demo
from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from tests.ports import find_free_port

from ..backfills import running_daemon
from ..user_project import write_user_project

INSTANCE_TEMPLATE = Path(feedapi_dagster.demo.__file__).with_name("dagster.yaml")
STALL_SECONDS = 30
PAGE_SECONDS = 1.0  # a throttled page's delay: a page of 50 events a second


class ThrottledServer(DemoFeedServer):
    """A demo server whose pages take `PAGE_SECONDS` each while `throttled` is set; `fetched` is set
    at its first page."""

    def __init__(self, feed: DemoFeed, page_seconds: float = PAGE_SECONDS):
        super().__init__(feed, dialect="published")
        self.page_seconds = page_seconds
        self.throttled = threading.Event()
        self.throttled.set()
        self.fetched = threading.Event()
        self.pages = 0

    def page(self, fetch):
        self.fetched.set()
        self.pages += 1
        if self.throttled.is_set():
            time.sleep(self.page_seconds)
        return super().page(fetch)


def _graphql(port: int, query: str, variables: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


LAUNCH = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""


def _launch(port: int, feed: str, partition: str) -> str:
    """A load of `partition` of `feed` launched as "Materialize" in the UI does: the webserver queues
    it, the daemon launches it through its code server."""
    params = {
        "selector": {
            "repositoryLocationName": "user",
            "repositoryName": "__repository__",
            "jobName": f"feedapi_{feed}_load",
        },
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition}]},
    }
    answer = _graphql(port, LAUNCH, {"params": params})
    launched = answer["data"]["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", answer
    return launched["run"]["runId"]


@contextlib.contextmanager
def running_webserver(project: Path, home: Path, port: int, log_path: Path) -> Iterator[subprocess.Popen]:
    env = {**os.environ, "DAGSTER_HOME": str(home), "ORDERS_FEED_TOKEN": "unused-by-the-demo-server"}
    with open(log_path, "wb") as log:
        webserver = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("dagster-webserver")),
                "-w",
                str(project / "workspace.yaml"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
            ],
            cwd=project,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                assert webserver.poll() is None, log_path.read_text()[-3000:]
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5).close()
                    break
                time.sleep(1)
            yield webserver
        finally:
            os.killpg(webserver.pid, signal.SIGTERM)
            webserver.wait(timeout=60)


def _wait(what: str, check, timeout: float, logs: list[Path]):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := check()) is not None and found is not False:
            return found
        time.sleep(0.5)
    tails = "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-2500:]}" for log in logs)
    raise AssertionError(f"{what}: not within {timeout:.0f} s\n{tails}")


def _worker_pid(instance: dg.DagsterInstance, run_id: str) -> int | None:
    for entry in instance.all_logs(run_id):
        if found := re.match(r"Started process for run \(pid: (\d+)\)", entry.message):
            return int(found.group(1))
    return None


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _status(instance: dg.DagsterInstance, run_id: str) -> dg.DagsterRunStatus:
    run = instance.get_run_by_id(run_id)
    assert run is not None
    return run.status


def _messages(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [entry.message for entry in instance.all_logs(run_id)]


def _longest_silence(instance: dg.DagsterInstance, run_id: str) -> float:
    times = [entry.timestamp for entry in instance.all_logs(run_id)]
    return max(later - earlier for earlier, later in zip(times, times[1:], strict=False))


def quick_monitoring_home(tmp_path: Path) -> Path:
    """A Dagster home with the shipped settings, run monitoring polling every 5 s (30 in the shipped
    file) and freeing a failed run's slots 5 s after its end (30): what is tested is that it frees
    them, not how soon."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    settings = yaml.safe_load(INSTANCE_TEMPLATE.read_text())
    settings["run_monitoring"] |= {"poll_interval_seconds": 5, "free_slots_after_run_end_seconds": 5}
    (home / "dagster.yaml").write_text(yaml.safe_dump(settings))
    return home


@pytest.mark.spark
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the run worker's parent through /proc")
def test_a_dead_load_is_failed_and_its_slot_freed_while_a_slow_live_load_finishes(tmp_path, connect_server):
    home = quick_monitoring_home(tmp_path)
    logs = [tmp_path / "daemon.log", tmp_path / "webserver.log"]
    # 1,500 events of 50 a page: 30 s of throttled reading for `orders` (killed within it); `slow` reads
    # a page every 3 s until the dead load has been failed, far longer than the stall limit, logging
    # its progress every 10 s
    with (
        ThrottledServer(DemoFeed(partitions=1, events=1500, seed=3)) as orders,
        # the slow load is of partition 1 (runs of one partition of two feeds run together since the
        # shipped dagster.yaml limits `feedapi/partition`, but this test does not need that)
        ThrottledServer(DemoFeed(partitions=2, events=3000, seed=4), page_seconds=3) as slow,
        dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance,
    ):
        schedule = {"enabled": False, "discovery_enabled": False, "stalled_load_seconds": STALL_SECONDS}
        project = write_user_project(
            tmp_path / "project",
            orders.url,
            {"mode": "embedded", "port": connect_server.port},  # the tests' shared server
            lakehouse=tmp_path / "lakehouse",
            feed={"schedule": schedule},
        )
        defs_yaml = project / "user_project" / "defs" / "feeds" / "defs.yaml"
        component = yaml.safe_load(defs_yaml.read_text())
        feeds = component["attributes"]["feeds"]
        feeds.append({**feeds[0], "name": "slow", "url": slow.url})
        defs_yaml.write_text(yaml.safe_dump(component, sort_keys=False))
        instance.add_dynamic_partitions("feedapi_orders", ["0"])
        instance.add_dynamic_partitions("feedapi_slow", ["0", "1"])
        port = find_free_port()
        with running_daemon(project, home, logs[0]), running_webserver(project, home, port, logs[1]):
            # one after the other: two runs registering the `feedapi` data source on one Spark server
            # at the same moment can fail with DATA_SOURCE_ALREADY_EXISTS (read.registration.register_feed_source)
            alive = _launch(port, "slow", "1")
            _wait("the slow load reading", slow.fetched.is_set, 180, logs)
            dead = _launch(port, "orders", "0")
            _wait("the load of orders reading", orders.fetched.is_set, 180, logs)
            worker = _wait("the worker's pid in its log", lambda: _worker_pid(instance, dead), 30, logs)
            code_server = _parent(worker)
            time.sleep(3)  # well into the read
            os.kill(worker, signal.SIGKILL)
            os.kill(code_server, signal.SIGKILL)
            killed = time.monotonic()
            held = instance.event_log_storage.get_concurrency_info("feedapi_orders").claimed_slots
            assert [slot.run_id for slot in held] == [dead], held  # the dead load holds the feed's one slot
            # what the killed worker's Spark job still reads goes quickly: it ends before the next load
            orders.throttled.clear()

            _wait(
                "the dead load marked failed", lambda: _status(instance, dead) == dg.DagsterRunStatus.FAILURE, 180, logs
            )
            failed_after = time.monotonic() - killed
            said = _messages(instance, dead)
            assert any(
                re.fullmatch(
                    rf"feed orders: this run's process is taken for dead \(a killed container or machine\): its log "
                    rf"has been silent for \d+ s, longer than schedule.stalled_load_seconds \({STALL_SECONDS} s\); "
                    r"marked failed by sensor feedapi_orders_stalled_loads so that its pool slot is freed\. What it "
                    r"committed stays; the next load goes on from the cursor of record",
                    message,
                )
                for message in said
            ), said[-5:]
            assert _status(instance, alive) == dg.DagsterRunStatus.STARTED
            # the slow load stays throttled until it has run past twice the limit, however quickly the
            # dead one was failed (a CI run failed it 41 s after the kill and the slow load ended at 59.9 s)
            started = instance.get_run_record_by_id(alive).start_time
            _wait(
                "the slow load past twice the limit", lambda: time.time() - started > 2 * STALL_SECONDS + 5, 120, logs
            )
            assert _status(instance, alive) == dg.DagsterRunStatus.STARTED
            slow.throttled.clear()

            _wait(
                "the dead load's pool slot freed",
                lambda: not instance.event_log_storage.get_concurrency_info("feedapi_orders").claimed_slots,
                120,
                logs,
            )
            freed_after = time.monotonic() - killed

            following = _launch(port, "orders", "0")
            _wait("the next load of orders", lambda: instance.get_run_by_id(following).is_finished, 240, logs)
            recovered_after = time.monotonic() - killed
            _wait("the slow load", lambda: instance.get_run_by_id(alive).is_finished, 240, logs)
            print(
                f"\nfailed {failed_after:.0f} s after the kill, slot freed after {freed_after:.0f} s, next load "
                f"succeeded after {recovered_after:.0f} s; the slow load's longest silence: "
                f"{_longest_silence(instance, alive):.1f} s; pages {orders.pages}, {slow.pages}"
            )
        assert instance.get_run_by_id(following).is_success, _messages(instance, following)[-10:]
        slow_run = instance.get_run_record_by_id(alive)
        assert slow_run.dagster_run.is_success, _messages(instance, alive)[-10:]
        assert slow_run.end_time - slow_run.start_time > 2 * STALL_SECONDS  # it ran past the limit, alive
        assert _longest_silence(instance, alive) < STALL_SECONDS / 2
        for feed, server, partition in (("orders", orders, 0), ("slow", slow, 1)):
            (record,) = instance.fetch_materializations(dg.AssetKey(["feedapi", feed]), limit=1).records
            assert record.partition_key == str(partition)
            assert record.asset_materialization.metadata["position"].value == len(
                server.feed.expected_events(partition)
            )
