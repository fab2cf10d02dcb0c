"""`FeedApiComponent` in a user's own `dg` project, and the Python factory merged into a user's
Definitions: no resource key, executor or name collides; `dg check` and `dg scaffold` work; a subclass's
`execute` is what the feed's asset runs."""

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg

from feedapi_dagster.orchestration import (
    RESOURCE_KEY,
    FeedApiResource,
    FeedApiTranslator,
    FeedConfig,
    FeedTranslatorData,
    ProjectConfig,
    SparkResource,
    build_feedapi_definitions,
)
from feedapi_dagster.orchestration.component import FeedApiComponent
from feedapi_dagster.spark.settings import SparkSettings

from ..user_project import MODULE, importable, write_user_project

DG = Path(sys.executable).with_name("dg")
KEY = dg.AssetKey(["feedapi", "orders"])


def dg_command(root: Path, *args: str, merged: bool = False) -> subprocess.CompletedProcess:
    """`dg` in the project at `root`; `merged`: its stderr in its stdout, in the order they were written."""
    env = {**os.environ, "VIRTUAL_ENV": str(Path(sys.executable).parents[1])}
    return subprocess.run(
        [str(DG), *args],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merged else subprocess.PIPE,
        text=True,
        timeout=300,
    )


def test_one_defs_yaml_adds_the_feed_beside_the_users_assets_and_spark_resource(user_project):
    defs = dg.load_from_defs_folder(path_within_project=user_project)
    dg.Definitions.validate_loadable(defs)
    assert {KEY, dg.AssetKey("daily_report")} <= set(defs.resolve_all_asset_keys())
    assert type(defs.resources["spark"]).__name__ == "LazyPySparkResource"  # the user's, untouched
    assert isinstance(defs.resources[RESOURCE_KEY], FeedApiResource)
    assert isinstance(defs.resources[RESOURCE_KEY].spark, SparkResource)
    assert defs.executor is None  # the user's executor choice stays the user's
    repo = defs.get_repository_def()
    assert {"feedapi_orders_discovery", "feedapi_orders_stalled_loads"} == {s.name for s in repo.sensor_defs}
    assert {"feedapi_orders_schedule"} == {s.name for s in repo.schedule_defs}
    # the sensor and the schedule target the asset (its page lists them), through a job of the asset
    job = defs.resolve_job_def("feedapi_orders_load")
    assert job.asset_layer.selected_asset_keys == {KEY}
    assert repo.get_sensor_def("feedapi_orders_discovery").job_name == job.name
    spec = defs.resolve_assets_def(KEY).specs_by_key[KEY]
    assert spec.metadata["dagster/table_name"].endswith("orders")
    assert [c.name for c in spec.metadata["dagster/column_schema"].columns][:2] == ["partition_id", "position"]
    # the token came from {{ env.ORDERS_FEED_TOKEN }} and shows nowhere in the definitions
    assert "tok-user-project-secret" not in repr(defs.resolve_assets_def(KEY).specs_by_key)


def test_the_factory_merges_with_a_users_definitions_and_its_translator_decides_the_spec(tmp_path):
    class TeamTranslator(FeedApiTranslator):
        def get_asset_spec(self, data: FeedTranslatorData) -> dg.AssetSpec:
            spec = super().get_asset_spec(data)
            return spec.replace_attributes(
                key=["lake", "raw", data.feed.name], group_name="raw", owners=["team:data"], tags={"tier": "bronze"}
            )

    project = ProjectConfig(lakehouse=str(tmp_path), feeds=[FeedConfig(name="orders", url="https://x.example/f")])

    @dg.asset
    def orders_report(spark: SparkResource) -> None:
        pass

    users = dg.Definitions(
        assets=[orders_report],
        resources={"spark": SparkResource(settings=SparkSettings(mode="local"))},
        executor=dg.multiprocess_executor,
    )
    merged = dg.Definitions.merge(users, build_feedapi_definitions(project, translator=TeamTranslator()))
    dg.Definitions.validate_loadable(merged)
    key = dg.AssetKey(["lake", "raw", "orders"])
    spec = merged.resolve_assets_def(key).specs_by_key[key]
    assert (spec.group_name, spec.owners, spec.tags["tier"]) == ("raw", ["team:data"], "bronze")
    assert spec.kinds == {"delta", "spark"}
    assert {"spark", RESOURCE_KEY} <= set(merged.resources)
    # the load job keeps its one-process executor whatever the code location's default
    assert merged.resolve_job_def("feedapi_orders_load").executor_def.name == "in_process"


def test_yaml_translation(tmp_path, monkeypatch):
    root = write_user_project(tmp_path / "project", "https://x.example/f", {"mode": "local"}, lakehouse=tmp_path)
    path = root / MODULE / "defs" / "feeds" / "defs.yaml"
    path.write_text(path.read_text() + '  translation:\n    key: "lake/{{ feed.name }}"\n    group_name: bronze\n')
    monkeypatch.setenv("ORDERS_FEED_TOKEN", "x")
    with importable(root):
        defs = dg.load_from_defs_folder(path_within_project=root)
    dg.Definitions.validate_loadable(defs)
    spec = defs.resolve_assets_def(dg.AssetKey(["lake", "orders"])).specs_by_key[dg.AssetKey(["lake", "orders"])]
    assert spec.group_name == "bronze"
    assert defs.resources[RESOURCE_KEY].spark.spark_settings == SparkSettings(mode="local")


def test_dg_check_names_a_misspelt_key_with_its_file_and_line_and_scaffold_writes_a_valid_defs_yaml(
    user_project, monkeypatch
):
    path = user_project / MODULE / "defs" / "feeds" / "defs.yaml"
    good = path.read_text()
    assert dg_command(user_project, "check", "defs").returncode == 0
    lines = good.splitlines()
    at = next(i for i, line in enumerate(lines) if "page_size_hint" in line)
    lines.insert(at + 1, lines[at].replace("page_size_hint: 50", "pagesize: 5"))
    path.write_text("\n".join(lines) + "\n")
    bad = dg_command(user_project, "check", "defs")
    assert bad.returncode != 0
    report = bad.stdout + bad.stderr
    assert f"{path}:{at + 2}" in report and "'pagesize' was unexpected" in report, report[-3000:]
    path.write_text(good)

    scaffolded = dg_command(
        user_project,
        "scaffold",
        "defs",
        "feedapi_dagster.FeedApiComponent",
        "audit_feed",
        "--name",
        "audit",
        "--url",
        "https://feeds.example.com/audit",
    )
    assert scaffolded.returncode == 0, scaffolded.stderr[-3000:]
    text = (user_project / MODULE / "defs" / "audit_feed" / "defs.yaml").read_text()
    assert "name: audit" in text and "{{ env.AUDIT_FEED_TOKEN }}" in text
    # a name the component would refuse is refused by the scaffold, which then writes nothing
    refused = dg_command(
        user_project, "scaffold", "defs", "feedapi_dagster.FeedApiComponent", "shop_feed", "--name", "Shop"
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    said = refused.stdout + refused.stderr
    assert "Error validating scaffold parameters for `feedapi_dagster.FeedApiComponent`:" in said, said[-3000:]
    assert (
        "Value error, feed name must match [a-z][a-z0-9_]* (it names a table and Dagster objects), got 'Shop' (`shop`?)"
    ) in said, said[-3000:]
    assert not (user_project / MODULE / "defs" / "shop_feed").exists()
    monkeypatch.setenv("AUDIT_FEED_TOKEN", "tok-audit")  # the token the scaffolded feed reads (not set: an error)
    checked = dg_command(user_project, "check", "defs")
    assert checked.returncode == 0, (checked.stdout + checked.stderr)[-3000:]


def test_a_subclass_execute_is_what_each_feed_asset_runs_with_the_components_resource(tmp_path):
    class AuditedFeeds(FeedApiComponent):
        def execute(self, context, feedapi, binding, config):
            calls.append(
                (
                    type(feedapi),
                    feedapi.spark.spark_settings,
                    binding.name,
                    list(context.partition_keys),
                    config.rebuild,
                )
            )
            # no Spark, no load: an observation, and the results its checks must have
            yield dg.AssetObservation(binding.key, metadata={"audited": True})
            for spec in context.assets_def.check_specs:
                yield dg.AssetCheckResult(asset_key=binding.key, check_name=spec.name, passed=True)

    calls: list = []
    component = AuditedFeeds(
        lakehouse=str(tmp_path),
        spark=SparkSettings(mode="local"),
        feeds=[FeedConfig(name="orders", url="https://x.example/f")],
    )
    defs = component.build_defs(dg.ComponentTree.for_test().load_context)
    assert defs.resources[RESOURCE_KEY] is component.resource
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("feedapi_orders", ["0"])
        run = defs.resolve_job_def("feedapi_orders_load").execute_in_process(
            instance=instance, partition_key="0", run_config={"ops": {"feedapi__orders": {"config": {"rebuild": [0]}}}}
        )
    assert run.success
    # the run's copy of the component's resource (Dagster sets up a resource per run)
    assert calls == [(FeedApiResource, SparkSettings(mode="local"), "orders", ["0"], [0])]
    (observation,) = [
        e.asset_observation_data.asset_observation
        for e in run.all_events
        if e.event_type == dg.DagsterEventType.ASSET_OBSERVATION
    ]
    assert observation.metadata["audited"].value is True
