"""The shipped dagster.yaml's run launcher: scheduled runs forked from a warm fork server, against the
demo server, a real instance in a temporary DAGSTER_HOME and real Delta tables (written by the tests' shared Spark server, read back with delta-rs).

A forked run worker that is killed mid-load is reported dead to run monitoring, and the next run
loads what it left, exactly once; a terminated run stops as CANCELED with its commits consistent."""
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.errors import DagsterInvariantViolationError
from dagster._core.instance.ref import InstanceRef
from dagster._core.launcher import WorkerStatus
from dagster._daemon.monitoring.run_monitoring import monitor_started_run
from deltalake import DeltaTable

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.demo.faults import Faults
from feedapi_dagster.lakehouse.state import read_committed_state
from feedapi_dagster.orchestration import build_definitions, load_config
from feedapi_dagster.orchestration.automation import register_discovered_partitions
from feedapi_dagster.orchestration.launcher import WORKER_TAG, ForkServerRunLauncher

REPO = Path(__file__).resolve().parents[2]
JOB = "feedapi_orders_sync"
PARTITIONS = 3


class Deployment:
    """A feeds file and DAGSTER_HOME as a deployment has them; runs created the way the daemon creates
    a schedule's run (with the code server's origin of the job) and launched by the instance."""

    def __init__(self, tmp_path: Path, feed: DemoFeed, server: DemoFeedServer, spark_port: int,
                 load: dict | None = None):
        self.feed = feed
        self.home = tmp_path / "dagster_home"
        self.home.mkdir()
        shutil.copy(REPO / "dagster_project" / "dagster.yaml", self.home / "dagster.yaml")
        self.config_path = tmp_path / "feeds.yaml"
        self.config_path.write_text(yaml.safe_dump({
            "lakehouse": str(tmp_path / "lakehouse"),
            "spark": {"mode": "embedded", "port": spark_port},  # the tests' shared server
            "feeds": [{"name": "orders", "url": server.url, "dialect": "published", "page_size_hint": 25,
                       **({"load": load} if load else {})}],
        }))
        self.project = load_config(self.config_path)
        self.defs = build_definitions(self.project)
        self.table = self.project.table_path(self.project.feeds[0])
        self.instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(self.home)))
        register_discovered_partitions(self.instance, self.project.feeds[0])

    def launch_scheduled_run(self) -> str:
        schedule = self.defs.resolve_schedule_def("feedapi_orders_schedule")
        with dg.build_schedule_context(instance=self.instance) as context:
            (request,) = schedule.evaluate_tick(context).run_requests
        origin = (ReconstructableRepository.for_module("dagster_project.definitions", "defs",
                                                       working_directory=str(REPO))
                  .get_reconstructable_job(JOB).get_python_origin())
        run = self.instance.create_run_for_job(self.defs.get_job_def(JOB), run_config=dict(request.run_config),
                                               tags=request.tags, job_code_origin=origin)
        self.instance.launch_run(run.run_id, workspace=None)
        return run.run_id

    def run(self, run_id: str) -> dg.DagsterRun:
        return self.instance.get_run_by_id(run_id)

    def wait(self, run_id: str, until=lambda run: run.is_finished, timeout: float = 120.0) -> dg.DagsterRun:
        deadline = time.monotonic() + timeout
        while not until(run := self.run(run_id)):
            assert time.monotonic() < deadline, f"run {run_id} still {run.status} after {timeout} s"
            time.sleep(0.02)
        return run

    def wait_for_commits(self, run_id: str, commits: int) -> dg.DagsterRun:
        """Until the run has made `commits` commits; it must still be running then."""
        def committed(run: dg.DagsterRun) -> bool:
            exists = any((Path(self.table) / "_delta_log").glob("*.json"))  # Spark creates the folder first
            return run.is_finished or (exists and read_committed_state(self.table).state.generation >= commits)

        run = self.wait(run_id, until=committed)
        assert run.status == dg.DagsterRunStatus.STARTED, f"the run is {run.status} already: make the load longer"
        return run

    def rows(self, partition: int) -> list[tuple[int, str]]:
        table = DeltaTable(self.table).to_pyarrow_table(columns=["partition_id", "position", "payload"])
        rows = [(r["position"], r["payload"]) for r in table.to_pylist() if r["partition_id"] == partition]
        return sorted(rows)

    def assert_committed_prefix(self, complete: bool) -> None:
        """Every partition holds the feed's first `position` events once, in order, as its cursor says."""
        state = read_committed_state(self.table).state
        for partition in range(PARTITIONS):
            rows = self.rows(partition)
            expected = self.feed.expected_events(partition)
            position = state.get(partition).position if state.get(partition) else 0
            assert [p for p, _ in rows] == list(range(position)), f"partition {partition}: positions"
            assert [payload for _, payload in rows] == expected[:position], f"partition {partition}: events"
            if complete:
                assert position == len(expected), f"partition {partition}: {position} of {len(expected)} events"


@pytest.fixture
def deployment(tmp_path, monkeypatch, request, connect_server):
    options = getattr(request, "param", {})
    feed = DemoFeed(partitions=PARTITIONS, events=options.get("events", 300), seed=5)
    faults = Faults(rate=1.0, kinds=("slow",)) if options.get("slow") else None
    with DemoFeedServer(feed, dialect="published", faults=faults) as server:
        deployment = Deployment(tmp_path, feed, server, connect_server.port, options.get("load"))
        # the fork server starts with the first launch and inherits this environment, as in the daemon
        monkeypatch.setenv("DAGSTER_HOME", str(deployment.home))
        monkeypatch.setenv("FEEDAPI_DAGSTER_CONFIG", str(deployment.config_path))
        with deployment.instance:  # disposing the instance stops the launcher's fork server
            yield deployment


def test_the_shipped_instance_forks_a_scheduled_run_that_materializes_every_partition(deployment):
    assert isinstance(deployment.instance.run_launcher, ForkServerRunLauncher)
    run = deployment.wait(deployment.launch_scheduled_run())
    assert run.is_success, [e.message for e in deployment.instance.all_logs(run.run_id)][-10:]

    worker = json.loads(run.tags[WORKER_TAG])
    assert worker["pid"] != os.getpid()
    started = [e.message for e in deployment.instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)]
    assert f"Started process for run (pid: {worker['pid']})." in started  # the run ran in the forked worker
    deployment.assert_committed_prefix(complete=True)
    state = read_committed_state(deployment.table).state
    for partition in range(PARTITIONS):
        (record,) = deployment.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(["feedapi", "orders"]), asset_partitions=[str(partition)]),
            limit=5).records
        assert record.run_id == run.run_id
        assert record.asset_materialization.metadata["cursor"].value == state.get(partition).cursor


def test_a_forked_run_loads_the_feeds_file_as_it_is_now(deployment):
    """The fork server has this library imported, not the code location: an edited feeds file is what
    the next run loads, without restarting the fork server."""
    assert deployment.wait(deployment.launch_scheduled_run()).is_success
    before = {partition: len(deployment.feed.expected_events(partition)) for partition in range(PARTITIONS)}
    deployment.feed.append(60)
    config = yaml.safe_load(deployment.config_path.read_text())
    config["feeds"][0]["event_id_field"] = "type"
    deployment.config_path.write_text(yaml.safe_dump(config))

    run = deployment.wait(deployment.launch_scheduled_run())
    assert run.is_success, [e.message for e in deployment.instance.all_logs(run.run_id)][-10:]
    deployment.assert_committed_prefix(complete=True)
    rows = DeltaTable(deployment.table).to_pyarrow_table(
        columns=["partition_id", "position", "payload", "payload_type", "event_id"]).to_pylist()
    objects = [row for row in rows if row["payload_type"] == "object"]
    id_field = {row["event_id"] == json.loads(row["payload"])[
        "type" if row["position"] >= before[row["partition_id"]] else "id"] for row in objects}
    assert id_field == {True}, "rows of the 2nd run keyed by the edited event_id_field, the 1st run's by id"
    assert sum(row["position"] >= before[row["partition_id"]] for row in objects) > 10


# every page takes 40 ms and a Spark job with its commit reads at most 150 events per partition: a load
# in ~20 commits, so that a kill lands between two of them
SLOW = {"events": 3000, "slow": True, "load": {"max_events_per_partition": 150}}


@pytest.mark.parametrize("deployment", [SLOW], indirect=True)
def test_a_killed_worker_is_reported_and_the_next_run_loses_nothing(deployment):
    run_id = deployment.launch_scheduled_run()
    launcher = deployment.instance.run_launcher
    run = deployment.wait_for_commits(run_id, 3)
    os.kill(json.loads(run.tags[WORKER_TAG])["pid"], signal.SIGKILL)

    deadline = time.monotonic() + 10
    while (health := launcher.check_run_worker_health(run)).status == WorkerStatus.RUNNING:
        assert time.monotonic() < deadline, "the killed worker is still reported running"
        time.sleep(0.02)
    assert health.status == WorkerStatus.FAILED
    # what the daemon's run monitoring does with that answer
    monitor_started_run(deployment.instance, None, deployment.instance.get_run_record_by_id(run_id),
                        _quiet_logger())
    assert deployment.run(run_id).status == dg.DagsterRunStatus.FAILURE
    deployment.assert_committed_prefix(complete=False)

    deployment.feed.append(90)  # the feed moves on while nothing loads it
    run = deployment.wait(deployment.launch_scheduled_run())
    assert run.is_success
    deployment.assert_committed_prefix(complete=True)


@pytest.mark.parametrize("deployment", [SLOW], indirect=True)
def test_a_terminated_run_is_canceled_with_consistent_commits(deployment):
    run_id = deployment.launch_scheduled_run()
    deployment.wait_for_commits(run_id, 2)
    assert deployment.instance.run_launcher.terminate(run_id)
    run = deployment.wait(run_id)
    assert run.status == dg.DagsterRunStatus.CANCELED
    deployment.assert_committed_prefix(complete=False)
    run = deployment.wait(deployment.launch_scheduled_run())
    assert run.is_success
    deployment.assert_committed_prefix(complete=True)


def test_a_run_of_another_python_goes_through_the_code_server(deployment):
    """Forking only serves code locations of this interpreter; any other goes the default way (gRPC),
    which needs the workspace that the daemon passes."""
    origin = (ReconstructableRepository.for_module("dagster_project.definitions", "defs", working_directory=str(REPO))
              .get_reconstructable_job(JOB).get_python_origin())
    origin = origin._replace(repository_origin=origin.repository_origin._replace(executable_path="/other/venv/python"))
    run = deployment.instance.create_run_for_job(deployment.defs.get_job_def(JOB), job_code_origin=origin)
    with pytest.raises(DagsterInvariantViolationError, match="requires a workspace"):
        deployment.instance.launch_run(run.run_id, workspace=None)
    assert WORKER_TAG not in deployment.run(run.run_id).tags
    assert sys.executable != "/other/venv/python"


def _quiet_logger():
    import logging

    return logging.getLogger("feedapi.tests.run_monitoring")
