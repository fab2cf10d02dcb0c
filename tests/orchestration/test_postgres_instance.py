"""The deployment's Dagster instance on PostgreSQL 15 (README "Deployment"): the shipped dagster.yaml
plus `storage: postgres` with `scheme: postgresql+psycopg2`, a load run of a feed through it on a
Spark Connect server used as a remote cluster (`spark: {mode: remote}` against the tests' embedded
server), and Dagster's documented plain `postgresql://`, which fails (SQLAlchemy 2.1 maps it to
psycopg 3, dagster-postgres brings psycopg2), told by `feedapi-dagster doctor` in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.lakehouse.spark_conf import SparkSettings
from feedapi_dagster.orchestration import FeedConfig, ProjectConfig, build_feedapi_definitions
from feedapi_dagster.orchestration.automation import load_request, register_discovered_partitions
from feedapi_dagster.orchestration.definitions import feed_bindings
from feedapi_dagster.orchestration.demo_commands import INSTANCE_TEMPLATE
from feedapi_dagster.orchestration.doctor import PLAIN_POSTGRES_SCHEME
from tests.ports import find_free_port

from ..postgres_server import PostgresServer, missing

pytestmark = pytest.mark.spark
DOCTOR = Path(sys.executable).with_name("feedapi-dagster")
EVENTS = 400


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


def test_a_load_runs_on_an_instance_in_postgresql_with_spark_as_a_remote(
    postgres, tmp_path, connect_server, monkeypatch
):
    postgres.create_database("dagster")
    storage = {
        "postgres": {
            "postgres_db": {
                "hostname": "127.0.0.1",
                "port": postgres.port,
                "username": "postgres",
                "db_name": "dagster",
                "scheme": "postgresql+psycopg2",
            }
        }
    }
    home = dagster_home(tmp_path / "home", storage)
    checked = doctor(home)
    assert checked.returncode == 0 and "the instance has what feed loads need" in checked.stdout, checked
    # a Spark Connect endpoint as a cluster's, the URL with its token (`;token=`)
    spark = SparkSettings(mode="remote", remote=connect_server.client_url())
    with DemoFeedServer(DemoFeed(partitions=2, events=EVENTS, seed=5), dialect="published") as server:
        project = ProjectConfig(
            lakehouse=str(tmp_path / "lakehouse"), spark=spark, feeds=[FeedConfig(name="orders", url=server.url)]
        )
        binding = next(feed_bindings(project))[0]
        defs = build_feedapi_definitions(project)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            keys = register_discovered_partitions(instance, binding)
            request = load_request(binding, [int(key) for key in keys], "postgres", keys)
            run = defs.resolve_job_def(binding.job_name).execute_in_process(
                run_config=request.run_config, instance=instance, tags=request.tags, raise_on_error=False
            )
            assert run.success
            stored = instance.get_run_by_id(run.run_id)
    assert keys == ["0", "1"]
    assert stored is not None and stored.is_success  # the run's record, read back from PostgreSQL
    import psycopg2

    connection = psycopg2.connect(host="127.0.0.1", port=postgres.port, user="postgres", dbname="dagster")
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM event_logs WHERE run_id = %s AND dagster_event_type = %s",
                           (run.run_id, "ASSET_MATERIALIZATION"))  # fmt: skip
            (materializations,) = cursor.fetchone()
    finally:
        connection.close()
    assert materializations == 2  # one per partition, in PostgreSQL's event log
    from deltalake import DeltaTable

    assert DeltaTable(str(tmp_path / "lakehouse" / "orders")).to_pyarrow_table(columns=["position"]).num_rows == EVENTS
