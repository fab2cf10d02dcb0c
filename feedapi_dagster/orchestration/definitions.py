"""The factory: a feeds configuration in, the Dagster definitions of its feeds out.

Per feed: the asset (with its checks), a job of that asset, the discovery sensor and the load
schedule targeting it, and a maintenance job with its schedule. The result has no executor and one
resource, under a key of its own, so it merges into any code location (`dg.Definitions.merge`).
"""
from __future__ import annotations

from collections.abc import Iterator

import dagster as dg

from .assets import build_feed_asset
from .automation import build_discovery_sensor, build_load_schedule
from .config import ProjectConfig
from .loads import FeedBinding
from .maintenance import build_maintenance_job, build_maintenance_schedule
from .resources import SparkResource
from .translator import FeedApiTranslator, FeedTranslatorData

SPARK_RESOURCE_KEY = "feedapi_spark"


def feed_bindings(project: ProjectConfig, translator: FeedApiTranslator | None = None,
                  spark_resource_key: str = SPARK_RESOURCE_KEY) -> Iterator[tuple[FeedBinding, dg.AssetSpec]]:
    """Each feed of `project` as the definitions bind it: its asset spec (the translator's) and binding."""
    translator = translator or FeedApiTranslator()
    for feed in project.feeds:
        spec = translator.get_asset_spec(FeedTranslatorData(feed, project.table_path(feed)))
        yield FeedBinding(project, feed, spec.key, spark_resource_key), spec


def build_feedapi_definitions(
    project: ProjectConfig,
    *,
    translator: FeedApiTranslator | None = None,
    spark: SparkResource | None = None,
    spark_resource_key: str = SPARK_RESOURCE_KEY,
) -> dg.Definitions:
    """`translator`: the asset spec of each feed (key, group, owners, tags, kinds); `spark`: the Spark
    resource the loads use (default: the project's `spark` settings), bound to `spark_resource_key`."""
    assets, jobs, sensors, schedules = [], [], [], []
    for binding, spec in feed_bindings(project, translator, spark_resource_key):
        asset = build_feed_asset(binding, spec)
        job = dg.define_asset_job(
            binding.job_name, selection=[asset],
            # one process per run for this job only: the default executor would start a second
            # process that imports everything again (4.3 s of a 8.8 s run start-up, benchmark of
            # 2026-11-20); a load is one step anyway
            executor_def=dg.in_process_executor,
            description=f"Loads partitions of feed `{binding.name}` (one run, many partitions).",
        )
        maintenance = build_maintenance_job(binding)
        assets.append(asset)
        jobs.extend([job, maintenance])
        sensors.append(build_discovery_sensor(binding, job))
        schedules.append(build_load_schedule(binding, job))
        if (maintenance_schedule := build_maintenance_schedule(binding, maintenance)) is not None:
            schedules.append(maintenance_schedule)
    return dg.Definitions(
        assets=assets, jobs=jobs, sensors=sensors, schedules=schedules,
        resources={spark_resource_key: spark or SparkResource.from_settings(project.spark_settings())},
    )
