"""The factory: a feeds configuration in, the Dagster definitions of its feeds out.

Per feed: the asset (with its checks), a job of that asset, the discovery sensor and the load
schedule targeting it (or, in stream mode, the stream job), the stream job, a maintenance job with
its schedule, and the stalled-load sensor (it fails the feed's runs whose process is gone). The result
has no executor and one resource, a `FeedApiResource` under a key of its own (`RESOURCE_KEY`), so it
merges into any code location (`dg.Definitions.merge`).
"""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg

# what `dg.define_asset_job` returns; dagster does not export its class
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from .assets import Execute, build_feed_asset, load_feed
from .automation import build_discovery_sensor, build_load_schedule
from .config import ProjectConfig
from .loads import RESOURCE_KEY, TABLE_METADATA_PREFIX, FeedBinding
from .maintenance_jobs import build_maintenance_job, build_maintenance_schedule
from .resources import FeedApiResource, SparkResource, shared_resource
from .stalled_loads import build_stalled_load_sensor
from .stream_jobs import build_stream_job
from .translator import FeedApiTranslator, FeedTranslatorData
from .warm_up import warm_up_under_dagster_dev


def feed_bindings(
    project: ProjectConfig, translator: FeedApiTranslator | None = None
) -> Iterator[tuple[FeedBinding, dg.AssetSpec]]:
    """Each feed of `project` as the definitions bind it: its asset spec (the translator's) and binding."""
    translator = translator or FeedApiTranslator()
    for feed in project.feeds:
        spec = translator.get_asset_spec(FeedTranslatorData(feed, project.table_path(feed)))
        yield FeedBinding(project, feed, spec.key), spec


def build_feedapi_definitions(
    project: ProjectConfig,
    *,
    translator: FeedApiTranslator | None = None,
    spark: dg.ConfigurableResource | None = None,
) -> dg.Definitions:
    """`translator`: the asset spec of each feed (key, group, owners, tags, kinds); `spark`: the Spark
    resource the loads use (default: a `SparkResource` of the project's `spark` settings), a
    `SparkResource` or a dagster-pyspark `PySparkResource` / `LazyPySparkResource`."""
    resource = FeedApiResource(spark=spark) if spark is not None else shared_resource(project.spark_settings())
    return feed_definitions(project, resource, translator)


def feed_definitions(
    project: ProjectConfig,
    resource: FeedApiResource,
    translator: FeedApiTranslator | None = None,
    execute: Execute = load_feed,
) -> dg.Definitions:
    """The definitions of `project`'s feeds, `resource` bound to `RESOURCE_KEY`; `execute`: what each
    feed's asset runs (a component's `execute`)."""
    if isinstance(resource.spark, SparkResource):
        warm_up_under_dagster_dev(resource.spark.spark_settings, [feed.payload_form for feed in project.feeds])
    assets: list[dg.AssetsDefinition] = []
    jobs: list[dg.JobDefinition | UnresolvedAssetJobDefinition] = []
    sensors: list[dg.SensorDefinition] = []
    schedules: list[dg.ScheduleDefinition] = []
    for binding, spec in feed_bindings(project, translator):
        asset = build_feed_asset(binding, spec, execute)
        job = dg.define_asset_job(
            binding.job_name,
            selection=[asset],
            # one process per run for this job only: the default executor would start a second
            # process that imports everything again (benchmarks/README.md, "Start-up choices"); a
            # load is one step anyway
            executor_def=dg.in_process_executor,
            description=f"Loads partitions of feed `{binding.name}` (one run, many partitions).",
        )
        maintenance = build_maintenance_job(binding)
        stream = build_stream_job(binding)
        assets.append(asset)
        jobs.extend([job, maintenance, stream])
        sensors.extend([build_discovery_sensor(binding, job), build_stalled_load_sensor(binding)])
        schedules.append(build_load_schedule(binding, job, stream))
        if (maintenance_schedule := build_maintenance_schedule(binding, maintenance)) is not None:
            schedules.append(maintenance_schedule)
    return dg.Definitions(
        assets=assets,
        jobs=jobs,
        sensors=sensors,
        schedules=schedules,
        resources={RESOURCE_KEY: resource},
        # which table each feed has: `feedapi-dagster sql` names the tables by their feeds from these
        metadata={f"{TABLE_METADATA_PREFIX}{feed.name}": project.table_path(feed) for feed in project.feeds},
    )
