"""A feed that needs a bearer token: the token must appear nowhere the product writes."""

import os
from pathlib import Path

import dagster as dg

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.orchestration import FeedConfig, ProjectConfig, SparkResource, build_feedapi_definitions
from feedapi_dagster.orchestration.automation import DiscoveryCursor, evaluate_discovery, load_request
from feedapi_dagster.orchestration.loads import FeedBinding
from feedapi_dagster.protocol import ProtocolError
from feedapi_dagster.spark.settings import SparkSettings

TOKEN = "tok-9f8e7d6c5b4a-secret"


def files_containing(root: Path, needle: bytes) -> list[Path]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file():
            try:
                if needle in path.read_bytes():
                    hits.append(path)
            except OSError:
                continue
    return hits


def test_the_token_never_leaks(spark, spark_work_dir, instance, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("ORDERS_TOKEN", TOKEN)
    feed = DemoFeed(partitions=2, events=100, seed=41)
    with DemoFeedServer(feed, dialect="published", token=TOKEN) as server:
        config = FeedConfig(name="orders", url=server.url, token_env="ORDERS_TOKEN")
        project = ProjectConfig(
            lakehouse=str(tmp_path / "lakehouse"), spark=SparkSettings(mode="local"), feeds=[config]
        )
        defs = build_feedapi_definitions(project, spark=SparkResource(settings=SparkSettings(mode="local")))
        binding = FeedBinding(project, config, dg.AssetKey(["feedapi", "orders"]))
        job = defs.resolve_job_def("feedapi_orders_load")
        known = instance.get_dynamic_partitions(binding.partitions_name)
        result = evaluate_discovery(binding, config.client().discover(), DiscoveryCursor(), known)
        for request in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        run = job.execute_in_process(
            run_config=result.run_requests[0].run_config, instance=instance, tags=result.run_requests[0].tags
        )
        assert run.success
        # a refused token: the failure is visible, the token is not
        monkeypatch.setenv("ORDERS_TOKEN", TOKEN + "-wrong")
        order = instance.get_dynamic_partitions(binding.partitions_name)
        again = load_request(binding, [0, 1], "wrong-token", order)
        failed = job.execute_in_process(
            run_config=again.run_config, instance=instance, tags=again.tags, raise_on_error=False
        )
        assert not failed.success
        errors = [e for e in failed.all_events if e.is_failure]
        assert errors and "not authorized (HTTP 401)" in str(errors[0].event_specific_data)
        try:
            config.client().discover()
        except ProtocolError as error:
            assert TOKEN not in str(error) and TOKEN not in repr(error)

    needle = TOKEN.encode()
    home = Path(instance.root_directory)
    logs = [str(e) for r in (run, failed) for e in r.all_events]
    assert not any(TOKEN in line for line in logs), "token in the Dagster event log"
    assert TOKEN not in caplog.text
    for root in (home, tmp_path / "lakehouse", spark_work_dir):
        assert files_containing(root, needle) == [], f"token written under {root}"
    assert any(home.rglob("*")), "nothing was written to DAGSTER_HOME: the search proves nothing"
    assert os.environ["ORDERS_TOKEN"].startswith(TOKEN)  # the environment is where it belongs
