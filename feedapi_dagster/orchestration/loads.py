"""What every Dagster entry point shares: building a loader for a feed, keeping two runs off one
partition, and turning load reports into materializations with the cursor in their metadata."""
from __future__ import annotations

from collections.abc import Iterable

import dagster as dg

from feedapi_dagster.lakehouse.delta import FeedTable
from feedapi_dagster.lakehouse.loader import FeedLoader, PartitionReport
from feedapi_dagster.lakehouse.sink import DeltaSink

from .config import FeedConfig, ProjectConfig
from .resources import SparkResource

FEED_TAG = "feedapi/feed"
PARTITIONS_TAG = "feedapi/partitions"  # comma-separated partition ids a multi-partition run loads
# One value per feed for multi-partition runs: dagster.yaml limits each value to one run at a time.
# (One-partition runs are limited by Dagster's own `dagster/partition` tag.)
LOCK_TAG = "feedapi/lock"
REBUILD_TAG = "feedapi/rebuild"
_ACTIVE = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


def asset_key(feed: FeedConfig) -> dg.AssetKey:
    return dg.AssetKey(["feedapi", feed.name])


def partitions_def_name(feed: FeedConfig) -> str:
    return f"feedapi_{feed.name}"


def sync_run_tags(feed: FeedConfig, partition_ids: Iterable[int], rebuild: bool = False) -> dict[str, str]:
    tags = {FEED_TAG: feed.name, PARTITIONS_TAG: ",".join(map(str, sorted(partition_ids))),
            LOCK_TAG: f"{feed.name}:sync"}
    if rebuild:
        tags[REBUILD_TAG] = "true"
    return tags


def active_partitions(instance: dg.DagsterInstance, feed: FeedConfig, exclude_run_id: str | None = None) -> set[int]:
    """Partitions that runs in progress are loading: syncs list theirs in a tag, one-partition runs
    of the asset (also those launched from the UI, without our tags) carry `dagster/partition`."""
    key = asset_key(feed)
    busy: set[int] = set()
    for run in instance.get_runs(dg.RunsFilter(statuses=_ACTIVE)):
        if run.run_id == exclude_run_id:
            continue
        if run.tags.get(FEED_TAG) == feed.name:
            listed = run.tags.get(PARTITIONS_TAG, "")
        elif run.asset_selection and key in run.asset_selection:
            listed = run.tags.get("dagster/partition", "")
        else:
            continue
        busy.update(int(p) for p in listed.split(",") if p.strip().isdigit())
    return busy


def feed_table(project: ProjectConfig, feed: FeedConfig, spark: SparkResource) -> FeedTable:
    return FeedTable(spark.session(), project.table_path(feed))


def make_loader(project: ProjectConfig, feed: FeedConfig, spark: SparkResource,
                context: dg.OpExecutionContext) -> FeedLoader:
    sink = DeltaSink(feed_table(project, feed, spark), run_id=context.run.run_id, compaction=feed.compaction)
    return FeedLoader(feed.source(), sink, feed.load, logger=context.log)


def report_metadata(report: PartitionReport, loader: FeedLoader) -> dict[str, dg.RawMetadataValue]:
    return {
        "cursor": report.cursor,
        "position": report.position,
        "events": report.events,
        "pages": report.pages,
        "duplicates_skipped": report.duplicates,
        "drained": report.drained,
        "rebuilt": report.rebuilt,
        "start_cursor": report.start_cursor,
        "dialect": loader.client.info.dialect,
        "table": dg.MetadataValue.path(loader.sink.path),
        "delta_version": report.delta_version if report.delta_version is not None else -1,
    }


def materializations(feed: FeedConfig, reports: Iterable[PartitionReport],
                     loader: FeedLoader) -> list[dg.AssetMaterialization]:
    """One materialization per partition this load committed something for."""
    return [
        dg.AssetMaterialization(asset_key(feed), partition=str(r.partition_id), metadata=report_metadata(r, loader))
        for r in reports if r.status == "loaded"
    ]


def latest_metadata_by_partition(instance: dg.DagsterInstance, feed: FeedConfig,
                                 partition_keys: list[str]) -> dict[str, dict]:
    """The metadata of each partition's latest materialization (partitions without one are left out),
    in two queries whatever the number of partitions."""
    latest = instance.event_log_storage.get_latest_storage_id_by_partition(
        asset_key(feed), dg.DagsterEventType.ASSET_MATERIALIZATION, set(partition_keys))
    if not latest:
        return {}
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key(feed), storage_ids=list(latest.values())), limit=len(latest)).records
    return {record.partition_key: {k: v.value for k, v in record.asset_materialization.metadata.items()}
            for record in records}


def mirror_repairs(instance: dg.DagsterInstance, feed: FeedConfig, loader: FeedLoader,
                   skip: Iterable[int]) -> list[dg.AssetMaterialization]:
    """Materializations for partitions whose latest one disagrees with the cursor of record in Delta
    (a run killed between its commit and its materialization): the next run sets the mirror right."""
    skip = set(skip)
    candidates = {partition_id: state for partition_id, state in sorted(loader.sink.state.partitions.items())
                  if partition_id not in skip and loader.client.info.partition(partition_id) is not None}
    latest = latest_metadata_by_partition(instance, feed, [str(partition_id) for partition_id in candidates])
    repairs = []
    for partition_id, state in candidates.items():
        mirrored = latest.get(str(partition_id), {})
        if mirrored.get("cursor") == state.cursor and mirrored.get("drained") == state.drained:
            continue
        report = PartitionReport(partition_id, "loaded", state.cursor, state.position, state.cursor,
                                 drained=state.drained, inherited_from=state.inherited_from)
        repairs.extend(materializations(feed, [report], loader))
    return repairs


def raise_for_failures(feed: FeedConfig, reports: Iterable[PartitionReport]) -> None:
    problems = [f"partition {r.partition_id}: {r.error}" for r in reports if r.status in ("failed", "invalid")]
    if problems:
        raise dg.Failure(
            description=f"feed {feed.name}: {len(problems)} partition(s) could not be loaded "
                        "(what was committed before the failure is kept): " + "; ".join(problems),
            allow_retries=True,
        )
