from dataclasses import dataclass, field

import dagster as dg
import pytest

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.lakehouse.delta_log import DeltaLog
from feedapi_dagster.lakehouse.maintenance import MaintenanceSettings
from feedapi_dagster.orchestration import (
    RESOURCE_KEY,
    FeedApiResource,
    FeedConfig,
    ProjectConfig,
    SparkResource,
    build_feedapi_definitions,
)
from feedapi_dagster.orchestration.config import ScheduleConfig, StorageConfig
from feedapi_dagster.orchestration.loads import FeedBinding
from feedapi_dagster.orchestration.run_storage import latest_metadata_by_partition
from feedapi_dagster.protocol import RetryPolicy
from feedapi_dagster.spark.settings import SparkSettings
from tests.conftest import Lakehouse, s3_lakehouse
from tests.user_project import importable, write_user_project


@pytest.fixture
def instance(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        yield instance


@dataclass
class Harness:
    """A feed served by the demo server, its project config, Definitions and a Dagster instance."""

    feed: DemoFeed
    server: DemoFeedServer
    project: ProjectConfig
    defs: dg.Definitions
    instance: dg.DagsterInstance
    cursor: str | None = None
    runs: list = field(default_factory=list)

    @property
    def feed_config(self) -> FeedConfig:
        return self.project.feeds[0]

    @property
    def name(self) -> str:
        return self.feed_config.name

    @property
    def table(self) -> str:
        return self.project.table_path(self.feed_config)

    @property
    def log(self) -> DeltaLog:
        """The table's log as delta-rs reads it in the run process (on local disk or on S3)."""
        return DeltaLog(self.table, self.project.storage_options())

    def tick_sensor(self) -> dg.SensorResult:
        sensor = self.defs.resolve_sensor_def(f"feedapi_{self.name}_discovery")
        with dg.build_sensor_context(instance=self.instance, cursor=self.cursor, definitions=self.defs) as context:
            result = sensor(context)
        self.cursor = result.cursor
        for request in result.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        return result

    def tick_schedule(self):
        schedule = self.defs.resolve_schedule_def(f"feedapi_{self.name}_schedule")
        with dg.build_schedule_context(instance=self.instance) as context:
            return schedule.evaluate_tick(context)

    @property
    def binding(self) -> FeedBinding:
        return FeedBinding(self.project, self.feed_config, dg.AssetKey(["feedapi", self.name]))

    @property
    def resource(self) -> FeedApiResource:
        return self.defs.resources[RESOURCE_KEY]

    def launch(self, request: dg.RunRequest, raise_on_error: bool = True) -> dg.ExecuteInProcessResult:
        """The run the request asks for, as the daemon would launch it: a run of the asset's job."""
        job = self.defs.resolve_job_def(f"feedapi_{self.name}_load")
        result = job.execute_in_process(
            run_config=request.run_config, instance=self.instance, tags=request.tags, raise_on_error=raise_on_error
        )
        self.runs.append(result)
        return result

    def materialize_partition(self, partition: int, tags=None) -> dg.ExecuteInProcessResult:
        asset = self.defs.get_assets_def(dg.AssetKey(["feedapi", self.name]))
        return dg.materialize(
            [asset],
            partition_key=str(partition),
            instance=self.instance,
            resources={RESOURCE_KEY: self.resource},
            tags=tags or {},
        )

    def metadata(self, partition: int) -> dict:
        latest = latest_metadata_by_partition(self.instance, self.binding, [str(partition)]).get(str(partition))
        return latest.metadata() if latest else {}


# A lakehouse on S3 with Spark in the test process: one Spark driver, which the project says by naming
# Delta's single-driver log store itself (`ProjectConfig` refuses `local` Spark on S3 otherwise).
SINGLE_DRIVER = {"spark.delta.logStore.s3a.impl": "io.delta.storage.S3SingleDriverLogStore"}


@pytest.fixture
def harness(spark, instance, tmp_path, request):
    """`request.param`: the feed (partitions, events, exactly_once, duplicate_ratio, dialect), its
    settings (rebuild_on_split, maintenance, payload_form) and where its table lives (`lakehouse`: "local" or "s3")."""
    options = getattr(request, "param", {})
    lakehouse = s3_lakehouse(request) if options.get("lakehouse") == "s3" else Lakehouse(str(tmp_path / "lakehouse"))
    feed = DemoFeed(
        partitions=options.get("partitions", 3),
        events=options.get("events", 300),
        seed=31,
        exactly_once=options.get("exactly_once", True),
        duplicate_ratio=options.get("duplicate_ratio", 0.0),
    )
    with DemoFeedServer(feed, dialect=options.get("dialect", "published")) as server:
        feed_config = FeedConfig(
            name="orders",
            url=server.url,
            page_size_hint=40,
            retry=RetryPolicy(base_delay=0.001, max_delay=0.01),
            schedule=ScheduleConfig(rebuild_on_split=options.get("rebuild_on_split", False)),
            maintenance=MaintenanceSettings(**options.get("maintenance", {})),
            payload_form=options.get("payload_form", "json"),
            payload_columns=options.get("payload_columns", {}),
        )
        project = ProjectConfig(
            lakehouse=lakehouse.root,
            storage=StorageConfig(s3=lakehouse.storage),
            spark=SparkSettings(mode="local", conf=SINGLE_DRIVER if lakehouse.on_s3 else {}),
            feeds=[feed_config],
        )
        defs = build_feedapi_definitions(project, spark=SparkResource(settings=SparkSettings(mode="local")))
        yield Harness(feed, server, project, defs, instance)


@pytest.fixture
def user_project(tmp_path, monkeypatch):
    # embedded Spark, as a scaffolded defs.yaml has it: two components with one Spark share its resource
    root = write_user_project(
        tmp_path / "project", "http://127.0.0.1:9/feed", {"mode": "embedded"}, lakehouse=tmp_path / "lakehouse"
    )
    monkeypatch.setenv("ORDERS_FEED_TOKEN", "tok-user-project-secret")
    with importable(root):
        yield root


def nakadi_harness(event_type, server, instance, tmp_path, **feed_options) -> Harness:
    """A project of one Nakadi feed `orders` of `event_type` on `server` (pages of 50; `feed_options`: its
    other settings), its lakehouse in `tmp_path`, local Spark."""
    feed = FeedConfig(
        name="orders", protocol="nakadi", url=server.url, event_type=event_type.name, page_size_hint=50, **feed_options
    )
    project = ProjectConfig(lakehouse=str(tmp_path / "lakehouse"), spark=SparkSettings(mode="local"), feeds=[feed])
    defs = build_feedapi_definitions(project, spark=SparkResource(settings=SparkSettings(mode="local")))
    return Harness(event_type, server, project, defs, instance)
