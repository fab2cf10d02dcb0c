"""The deployment path end to end: a user's dg project with one defs.yaml, `dagster-daemon` with the
demo dagster.yaml (Dagster's default run launcher, `concurrency` limits).

The discovery sensor's first tick registers the partitions and requests a run of the feed's asset;
the run coordinator and the default launcher start it in a process of its own. The run must succeed,
leave every event in the Delta table once, record a materialization per partition with Dagster's
standard table metadata and pass the checks that run in the load. A backfill, as the UI launches one,
goes through the daemon's backfill loop the same way."""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg
from dagster._core.execution.backfill import BulkActionStatus
from dagster._core.instance.ref import InstanceRef
from deltalake import DeltaTable

import feedapi_dagster.demo
from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.spark.class_archive import archive_path
from tests.conftest import TEST_SERVER_CONF
from tests.ports import find_free_port

from ..backfills import launch_backfill, running_daemon, wait_for_backfill
from ..user_project import write_user_project

INSTANCE_TEMPLATE = Path(feedapi_dagster.demo.__file__).with_name("dagster.yaml")


def test_the_daemon_runs_the_sensors_load_of_a_users_project(tmp_path, connect_server):
    feed = DemoFeed(partitions=3, events=300, seed=9)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(INSTANCE_TEMPLATE, home / "dagster.yaml")
    # the instance's SQLite storage created once, as `feedapi-dagster doctor` does in the README's set-up:
    # the daemon and its code server creating it at once can stamp its schema twice (Dagster 1.13:
    # "Version table 'alembic_version' has more than one head present"), and no run ever starts
    dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))).dispose()
    with DemoFeedServer(feed, dialect="published") as server:
        project = write_user_project(
            tmp_path / "project",
            server.url,
            {"mode": "embedded", "port": connect_server.port},  # the tests' shared server
            lakehouse=tmp_path / "lakehouse",
            feed={"schedule": {"enabled": False, "discovery_enabled": True}},
        )
        env = {**os.environ, "DAGSTER_HOME": str(home), "ORDERS_FEED_TOKEN": "unused-by-the-demo-server"}
        log = open(tmp_path / "daemon.log", "wb")
        daemon = subprocess.Popen(
            [str(Path(sys.executable).with_name("dagster-daemon")), "run", "-w", str(project / "workspace.yaml")],
            cwd=project,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            run, instance_records = _wait_for_a_finished_run(home, daemon, tmp_path / "daemon.log")
        finally:
            os.killpg(daemon.pid, signal.SIGTERM)
            daemon.wait(timeout=60)
            log.close()
    assert run.is_success, (tmp_path / "daemon.log").read_text()[-3000:]
    assert run.job_name == "feedapi_orders_load" and run.tags["feedapi/partitions"] == "0-2"
    materializations, checks = instance_records
    assert sorted(m.partition_key for m in materializations) == ["0", "1", "2"]
    for record in materializations:
        metadata = record.asset_materialization.metadata
        assert metadata["dagster/partition_row_count"].value == metadata["position"].value > 0
        assert metadata["dagster/table_name"].value.endswith("orders")
    assert checks == {
        "positions_contiguous": True,
        "no_duplicate_event_ids": True,
        "cursor_metadata_matches_delta": True,
    }
    table = (
        DeltaTable(str(tmp_path / "lakehouse" / "orders"))
        .to_pyarrow_table(columns=["partition_id", "position", "payload"])
        .to_pylist()
    )
    for partition in range(3):
        rows = sorted((r["position"], r["payload"]) for r in table if r["partition_id"] == partition)
        assert [payload for _, payload in rows] == feed.expected_events(partition)
        assert [position for position, _ in rows] == list(range(len(rows)))


def test_a_backfill_of_up_to_date_partitions_completes_successfully(tmp_path, monkeypatch):
    """The sensor's run starts the embedded Spark server (its log says so: port, log file, pid) and
    loads both partitions; a backfill of both (nothing new to read) must end COMPLETED_SUCCESS, each
    partition materialized with what it is: no event read, the cursor of record unchanged. The load
    observes the asset: when it was synced, how much it loaded."""
    port = find_free_port()  # no server there: the first run starts one
    feed = DemoFeed(partitions=2, events=120, seed=4)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(INSTANCE_TEMPLATE, home / "dagster.yaml")
    monkeypatch.setenv("ORDERS_FEED_TOKEN", "unused-by-the-demo-server")
    # the instance's storage is made here, before the daemon opens it too (both would create its tables)
    with (
        DemoFeedServer(feed, dialect="published") as server,
        dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance,
    ):
        project = write_user_project(
            tmp_path / "project",
            server.url,
            {"mode": "embedded", "port": port, "conf": TEST_SERVER_CONF},
            lakehouse=tmp_path / "lakehouse",
            feed={"schedule": {"enabled": False, "discovery_enabled": True}},
        )
        with running_daemon(project, home, tmp_path / "daemon.log") as daemon, _stopped_at_the_end(port):
            first, _ = _wait_for_a_finished_run(home, daemon, tmp_path / "daemon.log")
            assert first.is_success, (tmp_path / "daemon.log").read_text()[-3000:]
            said = _messages(instance, first)
            starting = next(m for m in said if m.startswith(f"Starting Spark Connect server on sc://127.0.0.1:{port}"))
            assert f"(log: /tmp/feedapi-dagster-spark-{port}/spark-connect-server.log)" in starting, said
            # the server the run started maps the class archive `make setup` trained
            ready = (
                rf"Spark Connect server ready on sc://127.0.0.1:{port} after [\d.]+ s \(pid \d+; classes mapped from "
            )
            assert any(re.fullmatch(ready + re.escape(f"{archive_path()})"), m) for m in said), said
            # it started the server itself: nobody warmed it up, and the run says what that costs
            assert any(
                m.startswith(f"the Spark server on port {port} was not warmed up: the first loads") for m in said
            )
            assert (
                f"Spark: the embedded Spark Connect server on sc://127.0.0.1:{port}; Spark UI: off "
                "(spark.ui.enabled is false in the Spark settings' conf; set it to true for one)" in said
            )
            before = {
                record.partition_key: record.asset_materialization.metadata["cursor"].value
                for record in instance.fetch_materializations(KEY, limit=10).records
            }
            backfill_id = launch_backfill(instance, project, KEY, ["0", "1"])
            backfill = wait_for_backfill(instance, backfill_id, daemon, tmp_path / "daemon.log")
            assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS, (tmp_path / "daemon.log").read_text()[-3000:]
            (run,) = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
            assert run.is_success
            records = instance.get_records_for_run(
                run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
            ).records
            metadata = {r.partition_key: r.asset_materialization.metadata for r in records}
            assert sorted(metadata) == ["0", "1"]
            for key, values in metadata.items():
                assert values["events"].value == 0 and values["status"].value == "up to date: nothing new"
                assert values["cursor"].value == before[key]
                assert values["delta_version"].value >= 0
            (seen,) = [
                r.asset_observation.metadata
                for r in instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION).records
                if "last_synced" in r.asset_observation.metadata
            ]  # the sync's (maintenance has its own)
            assert seen["partitions_synced"].value == 2 and seen["events_loaded"].value == 0
            assert abs(seen["last_synced"].value - _run_end(instance, run)) < 60
            # the backfill's run found the server running: it says which Spark, no start
            said = _messages(instance, run)
            assert not [m for m in said if "Starting Spark Connect server" in m], said
            assert any(m.startswith("Spark: the embedded Spark Connect server") for m in said), said


def _messages(instance: dg.DagsterInstance, run: dg.DagsterRun) -> list[str]:
    """The run's log as the UI lists it (its messages)."""
    return [entry.user_message for entry in instance.all_logs(run.run_id)]


@contextlib.contextmanager
def _stopped_at_the_end(port: int):
    """The embedded server a run of the test starts on `port` (it outlives the run) stopped at the end,
    found by its port (a free port the test chose), and its files in the temp folder removed."""
    try:
        yield
    finally:
        for stat in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                if f"spark.connect.grpc.binding.port={port}".encode() in stat.read_bytes().split(b"\0"):
                    os.killpg(os.getpgid(int(stat.parent.name)), signal.SIGTERM)  # the server's own group
        for path in Path(tempfile.gettempdir()).glob(f"feedapi-dagster-spark-{port}*"):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


KEY = dg.AssetKey(["feedapi", "orders"])


def _run_end(instance: dg.DagsterInstance, run: dg.DagsterRun) -> float:
    return instance.get_run_record_by_id(run.run_id).end_time


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
                    [
                        dg.AssetCheckKey(key, name)
                        for name in ("positions_contiguous", "no_duplicate_event_ids", "cursor_metadata_matches_delta")
                    ]
                )
                # a run that failed leaves its checks planned (no evaluation): the caller's assertion
                # on the run then shows the daemon's log
                checks = {
                    check_key.name: execution.evaluation.passed
                    for check_key, execution in evaluations.items()
                    if isinstance(execution.evaluation, dg.AssetCheckEvaluation)
                }
                return runs[-1], (materializations, checks)
            time.sleep(0.5)
    raise AssertionError(f"no run finished within {timeout:.0f} s: {log.read_text()[-3000:]}")
