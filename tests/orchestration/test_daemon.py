"""The deployment path end to end: a user's dg project with one defs.yaml, `dagster-daemon` with the
demo dagster.yaml (Dagster's default run launcher, `concurrency` limits).

The discovery sensor's first tick registers the partitions and requests a run of the feed's asset;
the run coordinator and the default launcher start it in a process of its own. The run must succeed,
leave every event in the Delta table once, record a materialization per partition with Dagster's
standard table metadata and pass the checks that run in the load."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
from dagster._core.instance.ref import InstanceRef
from deltalake import DeltaTable

import feedapi_dagster.demo
from feedapi_dagster.demo import DemoFeed, DemoFeedServer

from ..user_project import write_user_project

INSTANCE_TEMPLATE = Path(feedapi_dagster.demo.__file__).with_name("dagster.yaml")


def test_the_daemon_runs_the_sensors_load_of_a_users_project(tmp_path, connect_server):
    feed = DemoFeed(partitions=3, events=300, seed=9)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(INSTANCE_TEMPLATE, home / "dagster.yaml")
    with DemoFeedServer(feed, dialect="published") as server:
        project = write_user_project(
            tmp_path / "project", server.url,
            {"mode": "embedded", "port": connect_server.port},  # the tests' shared server
            lakehouse=tmp_path / "lakehouse", feed={"schedule": {"enabled": False, "discovery_enabled": True}})
        env = {**os.environ, "DAGSTER_HOME": str(home), "ORDERS_FEED_TOKEN": "unused-by-the-demo-server"}
        log = open(tmp_path / "daemon.log", "wb")
        daemon = subprocess.Popen([str(Path(sys.executable).with_name("dagster-daemon")), "run", "-w",
                                   str(project / "workspace.yaml")], cwd=project, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        try:
            run, instance_records = _wait_for_a_finished_run(home, daemon, tmp_path / "daemon.log")
        finally:
            os.killpg(daemon.pid, signal.SIGTERM)
            daemon.wait(timeout=60)
            log.close()
    assert run.is_success, (tmp_path / "daemon.log").read_text()[-3000:]
    assert run.job_name == "feedapi_orders_load" and run.tags["feedapi/partitions"] == "0,1,2"
    materializations, checks = instance_records
    assert sorted(m.partition_key for m in materializations) == ["0", "1", "2"]
    for record in materializations:
        metadata = record.asset_materialization.metadata
        assert metadata["dagster/partition_row_count"].value == metadata["position"].value > 0
        assert metadata["dagster/table_name"].value.endswith("orders")
    assert checks == {"positions_contiguous": True, "no_duplicate_event_ids": True,
                      "cursor_metadata_matches_delta": True}
    table = DeltaTable(str(tmp_path / "lakehouse" / "orders")).to_pyarrow_table(
        columns=["partition_id", "position", "payload"]).to_pylist()
    for partition in range(3):
        rows = sorted((r["position"], r["payload"]) for r in table if r["partition_id"] == partition)
        assert [payload for _, payload in rows] == feed.expected_events(partition)
        assert [position for position, _ in rows] == list(range(len(rows)))


def _wait_for_a_finished_run(home: Path, daemon: subprocess.Popen, log: Path, timeout: float = 240.0):
    key = dg.AssetKey(["feedapi", "orders"])
    deadline = time.monotonic() + timeout
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        while time.monotonic() < deadline:
            assert daemon.poll() is None, f"the daemon exited: {log.read_text()[-3000:]}"
            runs = [run for run in instance.get_runs() if run.is_finished]
            if runs:
                materializations = instance.fetch_materializations(key, limit=100).records
                evaluations = instance.event_log_storage.get_latest_asset_check_execution_by_key(
                    [dg.AssetCheckKey(key, name) for name in
                     ("positions_contiguous", "no_duplicate_event_ids", "cursor_metadata_matches_delta")])
                checks = {check_key.name: execution.evaluation.passed
                          for check_key, execution in evaluations.items() if execution.evaluation}
                return runs[-1], (materializations, checks)
            time.sleep(0.5)
    raise AssertionError(f"no run finished within {timeout:.0f} s: {log.read_text()[-3000:]}")
