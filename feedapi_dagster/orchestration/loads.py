"""What every Dagster entry point shares: building a loader for a feed, keeping two runs off one
partition, and turning load reports into materializations with the cursor in their metadata."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import dagster as dg

from feedapi_dagster.lakehouse.delta import FeedTable
from feedapi_dagster.lakehouse.loader import FeedLoader, LoadOutcome, PartitionReport
from feedapi_dagster.lakehouse.sink import DeltaSink

from .config import FeedConfig, ProjectConfig
from .resources import feed_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FEED_TAG = "feedapi/feed"
PARTITIONS_TAG = "feedapi/partitions"  # comma-separated partition ids a run requested by the sensor or schedule loads
REBUILD_TAG = "feedapi/rebuild"
BACKFILL_TAG = "dagster/backfill"
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
_ACTIVE = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


@dataclass(frozen=True)
class FeedBinding:
    """A feed as one code location defines it: its settings, its asset key (the translator's choice)
    and the key of the Spark resource its runs use."""

    project: ProjectConfig
    feed: FeedConfig
    key: dg.AssetKey
    spark_key: str

    @property
    def name(self) -> str:
        return self.feed.name

    @property
    def partitions_name(self) -> str:
        return f"feedapi_{self.feed.name}"

    @property
    def job_name(self) -> str:
        return f"feedapi_{self.feed.name}_load"

    @property
    def op_name(self) -> str:
        return self.key.to_python_identifier()

    @property
    def table_path(self) -> str:
        return self.project.table_path(self.feed)

    def table(self, context: dg.OpExecutionContext) -> FeedTable:
        """The feed's table, through the Spark session of the run's Spark resource."""
        return self.table_for(feed_session(getattr(context.resources, self.spark_key)))

    def table_for(self, spark: "SparkSession") -> FeedTable:
        return FeedTable(spark, self.table_path, storage_options=self.project.storage_options())


def partition_run_tags(binding: FeedBinding, partition_ids: Iterable[int], order: Sequence[str]) -> dict[str, str]:
    """Tags of a run of the asset over `partition_ids`: one partition key, or the range of keys (in the
    order the instance lists the dynamic partitions) from the first to the last of them. The run loads
    every due partition of its range; our own tag says which ones were asked for."""
    keys = {str(p) for p in partition_ids}
    tags = {FEED_TAG: binding.name, PARTITIONS_TAG: ",".join(sorted(keys, key=int))}
    if len(keys) == 1:
        tags["dagster/partition"] = next(iter(keys))
    else:
        ordered = [key for key in order if key in keys]
        tags[RANGE_START_TAG], tags[RANGE_END_TAG] = ordered[0], ordered[-1]
    return tags


def run_partitions(run: dg.DagsterRun, order: Sequence[str]) -> set[int]:
    """The partitions a run of the asset loads (its own list, its partition key or its key range)."""
    listed = run.tags.get(PARTITIONS_TAG) or run.tags.get("dagster/partition")
    if listed:
        return {int(p) for p in listed.split(",") if p.strip().isdigit()}
    start, end = run.tags.get(RANGE_START_TAG), run.tags.get(RANGE_END_TAG)
    if start in order and end in order:
        return {int(key) for key in order[order.index(start):order.index(end) + 1] if key.isdigit()}
    return set()


def runs_loading(instance: dg.DagsterInstance, binding: FeedBinding, exclude_run_id: str | None = None,
                 runs: dg.RunsFilter = dg.RunsFilter(statuses=_ACTIVE)) -> list[dg.RunRecord]:
    """Runs that load the feed (runs of its asset from a schedule, a sensor, a backfill or the UI),
    by default those in progress."""
    return [record for record in instance.get_run_records(runs)
            if record.dagster_run.run_id != exclude_run_id and _loads(record.dagster_run, binding)]


def _loads(run: dg.DagsterRun, binding: FeedBinding) -> bool:
    return (run.tags.get(FEED_TAG) == binding.name or run.job_name == binding.job_name
            or bool(run.asset_selection and binding.key in run.asset_selection))


def active_partitions(instance: dg.DagsterInstance, binding: FeedBinding, exclude_run_id: str | None = None) -> set[int]:
    """Partitions that runs in progress are loading."""
    order = instance.get_dynamic_partitions(binding.partitions_name)
    busy: set[int] = set()
    for record in runs_loading(instance, binding, exclude_run_id):
        busy |= run_partitions(record.dagster_run, order)
    return busy


def make_loader(binding: FeedBinding, context: dg.OpExecutionContext) -> FeedLoader:
    sink = DeltaSink(binding.table(context), run_id=context.run.run_id)
    return FeedLoader(binding.feed, sink, binding.feed.load, logger=context.log)


def report_metadata(report: PartitionReport, outcome: LoadOutcome, row_count: int) -> dict[str, dg.RawMetadataValue]:
    """The partition's cursor of record and what the load did, with Dagster's standard table keys."""
    return {
        "cursor": report.cursor,
        "position": report.position,
        "events": report.events,
        "pages": report.pages,
        "duplicates_skipped": report.duplicates,
        "read_seconds": round(report.read_seconds, 3),
        "events_per_second": round(report.events / report.read_seconds) if report.read_seconds else 0,
        "drained": report.drained,
        "rebuilt": report.rebuilt,
        "start_cursor": report.start_cursor,
        "dialect": outcome.info.dialect,
        "delta_version": report.delta_version if report.delta_version is not None else -1,
        # Dagster's standard keys; the table's rows are the partitions' committed positions summed
        "dagster/table_name": outcome.table.path,
        "dagster/partition_row_count": report.position,
        "dagster/row_count": row_count,
    }


def materializations(binding: FeedBinding, reports: Iterable[PartitionReport],
                     outcome: LoadOutcome) -> list[dg.AssetMaterialization]:
    """One materialization per partition this load committed something for."""
    rows = sum(p.position for p in outcome.committed.state.partitions.values())
    return [
        dg.AssetMaterialization(binding.key, partition=str(r.partition_id), metadata=report_metadata(r, outcome, rows))
        for r in reports if r.status == "loaded"
    ]


def latest_metadata_by_partition(instance: dg.DagsterInstance, binding: FeedBinding,
                                 partition_keys: list[str]) -> dict[str, dict]:
    """The metadata of each partition's latest materialization (partitions without one are left out),
    in two queries whatever the number of partitions."""
    # DagsterInstance has no public lookup of each partition's latest materialization; this storage
    # method is the one Dagster's own partition status uses (one query for all the keys)
    latest = instance.event_log_storage.get_latest_storage_id_by_partition(
        binding.key, dg.DagsterEventType.ASSET_MATERIALIZATION, set(partition_keys))
    if not latest:
        return {}
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=binding.key, storage_ids=list(latest.values())), limit=len(latest)).records
    return {record.partition_key: {k: v.value for k, v in record.asset_materialization.metadata.items()}
            for record in records}


def mirror_repairs(binding: FeedBinding, outcome: LoadOutcome, latest: dict[str, dict],
                   skip: Iterable[int]) -> list[dg.AssetMaterialization]:
    """Materializations for partitions whose latest one (`latest`, by partition key) disagrees with the
    cursor of record in Delta (a run killed between its commit and its materialization): the next run
    sets the mirror right."""
    skip = set(skip)
    candidates = {partition_id: state for partition_id, state in sorted(outcome.committed.state.partitions.items())
                  if partition_id not in skip and outcome.info.partition(partition_id) is not None}
    repairs = []
    for partition_id, state in candidates.items():
        mirrored = latest.get(str(partition_id), {})
        if mirrored.get("cursor") == state.cursor and mirrored.get("drained") == state.drained:
            continue
        report = PartitionReport(partition_id, "loaded", state.cursor, state.position, state.cursor,
                                 drained=state.drained, inherited_from=state.inherited_from)
        repairs.extend(materializations(binding, [report], outcome))
    return repairs


def failure(binding: FeedBinding, reports: Iterable[PartitionReport]) -> dg.Failure | None:
    problems = [f"partition {r.partition_id}: {r.error}" for r in reports if r.status in ("failed", "invalid")]
    if not problems:
        return None
    return dg.Failure(
        description=f"feed {binding.name}: {len(problems)} partition(s) could not be loaded "
                    "(what was committed before the failure is kept): " + "; ".join(problems),
        allow_retries=True,
    )
