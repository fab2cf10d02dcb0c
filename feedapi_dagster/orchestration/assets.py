"""The asset of a feed: one Delta table whose dynamic partitions are the feed's partitions."""

import dagster as dg

from .config import FeedConfig, ProjectConfig
from .loads import (REBUILD_TAG, active_partitions, asset_key, make_loader, materializations, mirror_repairs,
                    partitions_def_name, raise_for_failures, report_metadata)
from .resources import SparkResource

BACKFILL_TAG = "dagster/backfill"


def build_feed_asset(project: ProjectConfig, feed: FeedConfig) -> dg.AssetsDefinition:
    partitions = dg.DynamicPartitionsDefinition(name=partitions_def_name(feed))

    @dg.asset(
        key=asset_key(feed),
        partitions_def=partitions,
        group_name="feedapi",
        kinds={"delta", "spark"},
        # one run per partition key: dynamic partition ranges follow insertion order, so a
        # multi-key UI backfill must never become one range run that covers other keys
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=1),
        description=f"FeedAPI feed `{feed.name}` ({feed.url}) in the Delta table "
                    f"`{project.table_path(feed)}`, partitioned by FeedAPI partition.",
    )
    def feed_asset(context: dg.AssetExecutionContext, spark: SparkResource) -> dg.MaterializeResult:
        keys = context.partition_keys
        if len(keys) != 1:
            raise dg.Failure(f"feed {feed.name}: a run of this asset loads exactly one partition, got {keys}")
        partition_id = int(keys[0])
        busy = active_partitions(context.instance, feed, exclude_run_id=context.run.run_id)
        if partition_id in busy:
            raise dg.Failure(f"feed {feed.name} partition {partition_id}: another run is loading it; not starting "
                             "a second load (see the runs tagged feedapi/feed)", allow_retries=False)
        loader = make_loader(project, feed, spark, context)
        partition = loader.client.info.partition(partition_id)
        backfill = BACKFILL_TAG in context.run.tags
        rebuild = context.run.tags.get(REBUILD_TAG) == "true" or (backfill and partition is not None and partition.closed)
        if rebuild:
            context.log.info("partition %s: rebuilding from _first (rows replaced atomically)", partition_id)
            reports = loader.rebuild([partition_id])
        else:
            reports = loader.sync([partition_id])
        report = reports[partition_id]
        context.log.info("partition %s: %s, %d events, cursor %s", partition_id, report.status, report.events,
                         report.cursor)
        raise_for_failures(feed, reports.values())
        return dg.MaterializeResult(metadata=report_metadata(report, loader))

    return feed_asset


class SyncConfig(dg.Config):
    """What a multi-partition run loads. Empty `partitions`: every due partition of the feed."""

    partitions: list[int] = []
    rebuild: list[int] = []
    drop: list[int] = []


def build_sync_job(project: ProjectConfig, feed: FeedConfig) -> dg.JobDefinition:
    """One run, one process, many partitions: what the schedule and the sensor launch."""

    @dg.op(name=f"feedapi_{feed.name}_sync_op", tags={"kind": "spark"})
    def sync_op(context: dg.OpExecutionContext, config: SyncConfig, spark: SparkResource) -> None:
        busy = active_partitions(context.instance, feed, exclude_run_id=context.run.run_id)
        loader = make_loader(project, feed, spark, context)
        _register_partitions(context.instance, feed, [str(p.id) for p in loader.client.info.partitions])
        if config.rebuild:
            clash = busy & {*config.rebuild, *config.drop}
            if clash:
                raise dg.Failure(f"feed {feed.name}: partitions {sorted(clash)} are being loaded by another run")
            reports = loader.rebuild(config.rebuild, drop=config.drop)
        else:
            wanted = set(config.partitions) or {p.id for p in loader.client.info.partitions}
            if wanted & busy:
                context.log.info("skipping partitions %s: other runs are loading them", sorted(wanted & busy))
            reports = loader.sync(sorted(wanted - busy))
        # one line for the run (every log line is an event the instance stores); the materializations
        # carry each partition's figures
        summary = [f"{r.partition_id} {r.status} +{r.events}" + (f" ({r.duplicates} duplicates skipped)"
                                                                  if r.duplicates else "") for r in reports.values()]
        context.log.info("%d events into %d partitions: %s", sum(r.events for r in reports.values()), len(reports),
                         "; ".join(summary))
        for report in reports.values():
            if report.error:
                context.log.error("partition %s: %s", report.partition_id, report.error)
        for event in materializations(feed, reports.values(), loader):
            context.log_event(event)
        loaded = [r.partition_id for r in reports.values() if r.status == "loaded"]
        for event in mirror_repairs(context.instance, feed, loader, skip=loaded):
            context.log.info("partition %s: materialization metadata was behind Delta; recorded the cursor of "
                             "record", event.partition)
            context.log_event(event)
        loader.sink.compact_if_due()
        raise_for_failures(feed, reports.values())

    @dg.job(name=f"feedapi_{feed.name}_sync", tags={"feedapi/feed": feed.name},
            description=f"Loads many partitions of feed `{feed.name}` in one run (batches span partitions).")
    def sync_job():
        sync_op()

    return sync_job


def _register_partitions(instance: dg.DagsterInstance, feed: FeedConfig, keys: list[str]) -> None:
    """Partitions a run loads exist as dynamic partitions even if the sensor has not seen them yet."""
    name = partitions_def_name(feed)
    known = set(instance.get_dynamic_partitions(name))
    missing = [key for key in keys if key not in known]
    if missing:
        instance.add_dynamic_partitions(name, missing)

