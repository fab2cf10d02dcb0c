"""The deployment path of README "Deployment" end to end, on PostgreSQL 15: a user's dg project with one
defs.yaml (`spark: {mode: remote}` against the tests' embedded Spark Connect server, standing in for a
cluster's endpoint; discovery sensor and schedule on), DAGSTER_HOME with the shipped dagster.yaml plus
`storage: postgres` with `scheme: postgresql+psycopg2`, and `dagster-daemon run` doing the work: the
sensor discovers the partitions and requests their load, the run queue dequeues it under the shipped
concurrency and pool settings, a run worker loads; read back from PostgreSQL and Delta. And Dagster's
documented plain `postgresql://`, which fails (SQLAlchemy 2.1 maps it to psycopg 3, dagster-postgres
brings psycopg2), told by `feedapi-dagster doctor` in one line."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml
from deltalake import DeltaTable

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.lakehouse.cursor_record import read_committed_state
from feedapi_dagster.orchestration.demo_commands import INSTANCE_TEMPLATE
from feedapi_dagster.orchestration.doctor import PLAIN_POSTGRES_SCHEME
from tests.ports import find_free_port

from ..backfills import running_daemon
from ..postgres_server import PostgresServer, missing
from ..user_project import write_user_project

pytestmark = pytest.mark.spark
DOCTOR = Path(sys.executable).with_name("feedapi-dagster")
EVENTS = 120
KEY = dg.AssetKey(["feedapi", "orders"])
POOL = "feedapi_orders"
LOADS_TIMEOUT = 180.0
# README "Deployment"'s block, on the test's server
POSTGRES_DB = {"hostname": "127.0.0.1", "username": "postgres", "db_name": "dagster", "scheme": "postgresql+psycopg2"}


@pytest.fixture(scope="module")
def postgres():
    reason = missing()
    assert reason is None, reason  # `make test` installs it (`make postgres`): no skip
    server = PostgresServer(find_free_port())
    server.start()
    yield server
    server.stop()


def dagster_home(root: Path, storage: dict) -> Path:
    """A DAGSTER_HOME with the shipped dagster.yaml and `storage`."""
    root.mkdir()
    settings = yaml.safe_load(INSTANCE_TEMPLATE.read_text())
    (root / "dagster.yaml").write_text(yaml.safe_dump({**settings, "storage": storage}))
    return root


def doctor(home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(DOCTOR), "doctor", "--dagster-home", str(home)], capture_output=True, text=True, timeout=120
    )


def test_the_documented_plain_postgresql_scheme_is_one_line_of_doctor(postgres, tmp_path):
    postgres.create_database("plain")
    home = dagster_home(tmp_path / "home", {"postgres": {"postgres_url": postgres.url("plain", scheme="postgresql")}})
    with pytest.raises(ModuleNotFoundError, match="No module named 'psycopg'"):
        dg.DagsterInstance.from_config(str(home))
    checked = doctor(home)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert checked.stdout.strip() == PLAIN_POSTGRES_SCHEME and not checked.stderr.strip(), checked


def test_the_daemon_loads_a_feed_on_an_instance_in_postgresql_with_spark_as_a_remote(
    postgres, tmp_path, connect_server
):
    """README "Deployment" as a deployment runs it: `dagster-daemon run` on a user's project, its
    discovery sensor finding the partitions and requesting their load, the run queue dequeuing the run
    under the shipped concurrency and pool settings, a run worker loading through the Spark Connect URL."""
    postgres.create_database("dagster")
    home = dagster_home(tmp_path / "home", {"postgres": {"postgres_db": POSTGRES_DB | {"port": postgres.port}}})
    # the README's set-up: doctor checks the instance (and opens it: its schema is made before the daemon's)
    checked = doctor(home)
    assert checked.returncode == 0 and "the instance has what feed loads need" in checked.stdout, checked
    feed = DemoFeed(partitions=2, events=EVENTS, seed=5)
    with DemoFeedServer(feed, dialect="published") as server:
        project = write_user_project(
            tmp_path / "project",
            server.url,
            # a Spark Connect endpoint as a cluster's, the URL with its token (`;token=`)
            {"mode": "remote", "remote": connect_server.client_url()},
            lakehouse=tmp_path / "lakehouse",
            # as a deployment has them; the shortest interval the defs allow, for the test's time
            feed={"schedule": {"enabled": True, "discovery_enabled": True, "discovery_interval_seconds": 5}},
        )
        log = tmp_path / "daemon.log"
        with (
            dg.DagsterInstance.from_config(str(home)) as instance,
            running_daemon(project, home, log) as daemon,
        ):
            runs = _loads_done(instance, daemon, log)
            materialized = {
                record.partition_key: record.asset_materialization.metadata
                for record in instance.fetch_materializations(KEY, limit=100, ascending=True).records
            }  # each partition's latest (ascending: the last one wins)
            pool = instance.event_log_storage.get_concurrency_info(POOL)
            # the sensors and the schedule the daemon runs, by name and status
            instigators = {state.instigator_name: state.status.value for state in instance.all_instigator_state()}
    said = log.read_text()
    assert all(run.is_success for run in runs), said[-3000:]
    first = runs[-1]  # get_runs lists the newest first
    assert first.tags.get("dagster/sensor_name") == "feedapi_orders_discovery", first.tags
    assert first.tags["feedapi/partitions"] == "0,1"
    assert sorted(materialized) == ["0", "1"]
    state = read_committed_state(str(tmp_path / "lakehouse" / "orders")).state
    for key, metadata in materialized.items():  # the materialization mirrors the cursor of record
        assert metadata["cursor"].value == state.get(int(key)).cursor
        assert metadata["position"].value == state.get(int(key)).position
    # the pool of the feed's loads, made by the run's claim from the shipped default_limit
    assert pool.slot_count == 1 and not pool.pending_step_count, pool
    # both on as the defs.yaml declares them (the status of an instigator running by its default)
    assert (
        instigators.get("feedapi_orders_discovery") == instigators.get("feedapi_orders_schedule") == "DECLARED_IN_CODE"
    )
    rows = (
        DeltaTable(str(tmp_path / "lakehouse" / "orders"))
        .to_pyarrow_table(columns=["partition_id", "position", "payload"])
        .to_pylist()
    )
    for partition in range(2):  # every event once, in order
        stored = sorted((r["position"], r["payload"]) for r in rows if r["partition_id"] == partition)
        assert [payload for _, payload in stored] == feed.expected_events(partition)
        assert [position for position, _ in stored] == list(range(len(stored)))


def _loads_done(instance: dg.DagsterInstance, daemon: subprocess.Popen, log: Path) -> list[dg.DagsterRun]:
    """The instance's runs, newest first, once every one went through the run queue (enqueued, then
    launched by the daemon's run coordinator), none is queued or running and both partitions are
    materialized (or a run failed); the test fails with the daemon's log tail if that takes longer than
    LOADS_TIMEOUT or the daemon exits."""
    deadline = time.monotonic() + LOADS_TIMEOUT
    while time.monotonic() < deadline:
        assert daemon.poll() is None, f"the daemon exited ({daemon.returncode}): {log.read_text()[-3000:]}"
        runs = list(instance.get_runs())
        if any(run.status == dg.DagsterRunStatus.FAILURE for run in runs):
            return runs
        queued = runs and all(instance.get_run_stats(run.run_id).enqueued_time is not None for run in runs)
        materialized = {r.partition_key for r in instance.fetch_materializations(KEY, limit=100).records}
        if queued and all(run.is_finished for run in runs) and materialized == {"0", "1"}:
            return runs
        time.sleep(1)
    states = [(run.job_name, run.status.value) for run in instance.get_runs()]
    raise AssertionError(f"no load done within {LOADS_TIMEOUT:.0f} s (runs: {states}); the daemon's log: "
                         f"{log.read_text()[-3000:]}")  # fmt: skip
