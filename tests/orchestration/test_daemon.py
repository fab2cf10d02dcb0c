"""The deployment path end to end: `dagster-daemon` with the shipped dagster.yaml and workspace.yaml.

The discovery sensor's first tick registers the partitions and requests a run; the queued run
coordinator hands it to the instance's run launcher, which forks it from its fork server. The run
must succeed in a forked worker and leave every event in the Delta table once."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import yaml
from dagster._core.instance.ref import InstanceRef
from deltalake import DeltaTable

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.orchestration.launcher import WORKER_TAG

REPO = Path(__file__).resolve().parents[2]


def test_the_daemon_launches_the_sensors_run_in_a_forked_worker(tmp_path, connect_server):
    feed = DemoFeed(partitions=3, events=300, seed=9)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster_project" / "dagster.yaml", home / "dagster.yaml")
    with DemoFeedServer(feed, dialect="published") as server:
        config = tmp_path / "feeds.yaml"
        config.write_text(yaml.safe_dump({
            "lakehouse": str(tmp_path / "lakehouse"),
            "spark": {"mode": "embedded", "port": connect_server.port},  # the tests' shared server
            "feeds": [{"name": "orders", "url": server.url, "dialect": "published", "page_size_hint": 50,
                       "schedule": {"enabled": False, "discovery_enabled": True}}],
        }))
        env = {**os.environ, "DAGSTER_HOME": str(home), "FEEDAPI_DAGSTER_CONFIG": str(config)}
        log = open(tmp_path / "daemon.log", "wb")
        daemon = subprocess.Popen([str(Path(sys.executable).with_name("dagster-daemon")), "run", "-w",
                                   str(REPO / "workspace.yaml")], cwd=REPO, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        try:
            run = _wait_for_a_finished_run(home, daemon, tmp_path / "daemon.log")
        finally:
            os.killpg(daemon.pid, signal.SIGTERM)
            daemon.wait(timeout=60)
            log.close()
    assert run.is_success, (tmp_path / "daemon.log").read_text()[-3000:]
    worker = json.loads(run.tags[WORKER_TAG])
    assert worker["pid"] != daemon.pid
    table = DeltaTable(str(tmp_path / "lakehouse" / "orders")).to_pyarrow_table(
        columns=["partition_id", "position", "payload"]).to_pylist()
    for partition in range(3):
        rows = sorted((r["position"], r["payload"]) for r in table if r["partition_id"] == partition)
        assert [payload for _, payload in rows] == feed.expected_events(partition)
        assert [position for position, _ in rows] == list(range(len(rows)))


def _wait_for_a_finished_run(home: Path, daemon: subprocess.Popen, log: Path, timeout: float = 180.0) -> dg.DagsterRun:
    deadline = time.monotonic() + timeout
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        while time.monotonic() < deadline:
            assert daemon.poll() is None, f"the daemon exited: {log.read_text()[-3000:]}"
            runs = [run for run in instance.get_runs() if run.is_finished]
            if runs:
                return runs[-1]
            time.sleep(0.5)
    raise AssertionError(f"no run finished within {timeout:.0f} s: {log.read_text()[-3000:]}")
