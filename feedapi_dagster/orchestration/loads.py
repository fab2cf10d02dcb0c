"""What every Dagster entry point shares: a feed as the definitions bind it, the run configuration of
a load, keeping two runs off one partition (and VACUUM off what a load may still write), turning load
reports into materializations with the cursor in their metadata, a sync into one observation of the
asset (when it was last synced, how far behind the feed it is), and a maintenance into another."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import dagster as dg

# what a metadata dict may hold before Dagster normalizes it; dagster does not export the alias (and its
# module `__getattr__` lets mypy take `dg.RawMetadataValue` for Any)
from dagster._core.definitions.metadata import RawMetadataValue

from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.lakehouse.load_report import LoadOutcome, LoadStatus, PartitionReport
from feedapi_dagster.lakehouse.maintenance import RUNNING_LOAD_MARGIN_HOURS, MaintenanceReport
from feedapi_dagster.protocol import ProtocolError
from feedapi_dagster.protocol.models import FIRST

from .config import FeedConfig, ProjectConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FEED_TAG = "feedapi/feed"
PARTITIONS_TAG = "feedapi/partitions"  # the partition ids a run of the sensor or the schedule loads (`partitions_tag`)
# The instance indexes run tags, and PostgreSQL refuses an index row over 8191 bytes: a run tagged with
# 2,000 ids one by one could not be created. Runs of 3+ ids go as ranges ("0-1999"), and a list still
# longer than this is left out: the run then loads every due partition of its key range.
MAX_PARTITIONS_TAG_CHARS = 1000
# On a run of one partition that the feed's sensor or schedule requests: "<feed>/<partition>", the key of
# the shipped dagster.yaml's limit of one run per partition of a feed (`dagster/partition` alone is
# "0" for partition 0 of every feed). Dagster's backfill runs carry only its own tags: the pool
# `feedapi_<feed>` and the asset's skipping of busy partitions hold them.
PARTITION_LIMIT_TAG = "feedapi/partition"
REBUILD_TAG = "feedapi/rebuild"
MAINTENANCE_TAG = "feedapi/maintenance"  # on the runs of a feed's maintenance job: the feed's name
# On the schedule's runs: a sync of every open partition, every few minutes. Its partitions with
# nothing new get no materialization (thousands of events per sync); the sync's observation says it.
SYNC_TAG = "feedapi/sync"
SCHEDULED_SYNC = "schedule"
# Report statuses of a partition the load brought (or found) up to date: a success for Dagster.
SUCCEEDED = frozenset({"loaded", "drained", "waiting"})
BACKFILL_TAG = "dagster/backfill"
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
ACTIVE_STATUSES = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
_IN_PROGRESS = dg.RunsFilter(statuses=ACTIVE_STATUSES)
_ENDED = [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]


class LoadConfig(dg.Config):
    """Run configuration of a load. Empty: bring every due partition of the run's keys up to date."""

    rebuild: list[int] = []  # partitions to reload from `_first`, their rows replaced atomically
    drop: list[int] = []  # partitions whose rows go in the same commit (the vanished parent of a split)


@dataclass(frozen=True)
class FeedBinding:
    """A feed as one code location defines it: its settings and its asset key (the translator's choice)."""

    project: ProjectConfig
    feed: FeedConfig
    key: dg.AssetKey

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

    def table_for(self, spark: SparkSession) -> FeedTable:
        return FeedTable(
            spark, self.table_path, storage_options=self.project.storage_options(), layout=self.feed.layout
        )


def partition_run_tags(binding: FeedBinding, partition_ids: Iterable[int], order: Sequence[str]) -> dict[str, str]:
    """Tags of a run of the asset over `partition_ids`: one partition key, or the range of keys (in the
    order the instance lists the dynamic partitions) from the first to the last of them. The run loads
    every due partition of its range; our own tag says which ones were asked for, where it is short."""
    keys = {str(p) for p in partition_ids}
    tags = {FEED_TAG: binding.name}
    if len(listed := partitions_tag(int(key) for key in keys)) <= MAX_PARTITIONS_TAG_CHARS:
        tags[PARTITIONS_TAG] = listed
    if len(keys) == 1:
        tags["dagster/partition"] = key = next(iter(keys))
        tags[PARTITION_LIMIT_TAG] = f"{binding.name}/{key}"
    else:
        ordered = [key for key in order if key in keys]
        tags[RANGE_START_TAG], tags[RANGE_END_TAG] = ordered[0], ordered[-1]
    return tags


def partitions_tag(partition_ids: Iterable[int]) -> str:
    """Partition ids as a tag's value: "0-2,5,7,9-12"."""
    ids = sorted(set(partition_ids))
    runs: list[list[int]] = []
    for pid in ids:
        if runs and pid == runs[-1][-1] + 1:
            runs[-1].append(pid)
        else:
            runs.append([pid])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) >= 3 else ",".join(map(str, run)) for run in runs)


def listed_partitions(tags: Mapping[str, str]) -> set[int] | None:
    """The partition ids a run's `PARTITIONS_TAG` lists (None: it has none)."""
    listed = tags.get(PARTITIONS_TAG)
    if not listed:
        return None
    ids: set[int] = set()
    for item in listed.split(","):
        first, _, last = item.strip().partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            ids.update(range(int(first), int(last or first) + 1))
    return ids


def run_partitions(run: dg.DagsterRun, order: Sequence[str]) -> set[int]:
    """The partitions a run of the asset loads (its own list, its partition key or its key range)."""
    if (listed := listed_partitions(run.tags)) is not None:
        return listed
    if (key := run.tags.get("dagster/partition")) and key.isdigit():
        return {int(key)}
    start, end = run.tags.get(RANGE_START_TAG), run.tags.get(RANGE_END_TAG)
    if start in order and end in order:
        return {int(key) for key in order[order.index(start) : order.index(end) + 1] if key.isdigit()}
    return set()


def runs_loading(
    instance: dg.DagsterInstance,
    binding: FeedBinding,
    exclude_run_id: str | None = None,
    runs: dg.RunsFilter = _IN_PROGRESS,
) -> list[dg.RunRecord]:
    """Runs that load the feed (runs of its asset from a schedule, a sensor, a backfill or the UI),
    by default those in progress."""
    return [
        record
        for record in instance.get_run_records(runs)
        if record.dagster_run.run_id != exclude_run_id and _loads(record.dagster_run, binding)
    ]


def _loads(run: dg.DagsterRun, binding: FeedBinding) -> bool:
    return (
        run.tags.get(FEED_TAG) == binding.name
        or run.job_name == binding.job_name
        or bool(run.asset_selection and binding.key in run.asset_selection)
    )


def active_partitions(
    instance: dg.DagsterInstance, binding: FeedBinding, exclude_run_id: str | None = None
) -> set[int]:
    """Partitions that runs in progress are loading."""
    order = instance.get_dynamic_partitions(binding.partitions_name)
    busy: set[int] = set()
    for record in runs_loading(instance, binding, exclude_run_id):
        busy |= run_partitions(record.dagster_run, order)
    return busy


def oldest_running_load(
    instance: dg.DagsterInstance, binding: FeedBinding, exclude_run_id: str | None = None
) -> dt.datetime | None:
    """When the oldest load of the feed that may still write started (None: there is none): runs in
    progress, and runs that failed or were canceled within the margin (a killed run's Spark job can
    still commit after it). VACUUM's retention is never below its age."""
    recently = dt.datetime.now(dt.UTC) - dt.timedelta(hours=RUNNING_LOAD_MARGIN_HOURS)
    records = [
        *runs_loading(instance, binding, exclude_run_id),
        *runs_loading(instance, binding, exclude_run_id, dg.RunsFilter(statuses=_ENDED, updated_after=recently)),
    ]
    starts = [record.start_time or record.create_timestamp.timestamp() for record in records]
    return dt.datetime.fromtimestamp(min(starts), dt.UTC) if starts else None


def report_metadata(report: PartitionReport, outcome: LoadOutcome, row_count: int) -> dict[str, RawMetadataValue]:
    """The partition's cursor of record and what the load did, with Dagster's standard table keys.
    A partition the load committed nothing for has the cursor and Delta version of the state."""
    version = report.delta_version if report.delta_version is not None else outcome.committed.delta_version
    return {
        "status": _status(report),
        "cursor": report.cursor,
        "position": report.position,
        "events": report.events,
        "pages": report.pages,
        "duplicates_skipped": report.duplicates,
        # the partition's own read, from its first request to its checkpoint row, and the load's
        # wall time that read it (Spark's job, the write, the commits): no rate per partition, which
        # said nothing true of either
        "read_seconds": round(report.read_seconds, 3),
        "load_seconds": round(report.load_seconds, 3),
        "drained": report.drained,
        "rebuilt": report.rebuilt,
        "start_cursor": report.start_cursor,
        "protocol": outcome.info.protocol,
        **({"dialect": outcome.info.dialect} if outcome.info.dialect else {}),
        "delta_version": version if version is not None else -1,
        # Dagster's standard keys; the table's rows are the partitions' committed positions summed
        "dagster/table_name": outcome.table.path,
        "dagster/partition_row_count": report.position,
        "dagster/row_count": row_count,
    }


def _status(report: PartitionReport) -> str:
    if report.status is LoadStatus.LOADED:
        return "loaded" if report.delta_version is not None else "up to date: nothing new"
    if report.status is LoadStatus.WAITING:
        return f"waiting: {report.waiting_for}"  # the plan's reason (which parent it waits for)
    return report.status.value


def materialized_reports(run: dg.DagsterRun, outcome: LoadOutcome, asked: Iterable[int]) -> list[PartitionReport]:
    """The partitions a run logs a materialization for: each it committed something for and, unless
    it is the schedule's sync, each of those it was asked for (`asked`) that it found up to date
    (a backfill's partitions succeed when they are materialized; the UI shows them so)."""
    committed = [r for r in outcome.reports.values() if r.status == "loaded" and r.delta_version is not None]
    if run.tags.get(SYNC_TAG) == SCHEDULED_SYNC:
        return committed
    asked = set(asked)
    return [
        r
        for r in outcome.reports.values()
        if r.status in SUCCEEDED and (r.delta_version is not None or r.partition_id in asked)
    ]


def materializations(
    binding: FeedBinding, reports: Iterable[PartitionReport], outcome: LoadOutcome
) -> list[dg.AssetMaterialization]:
    """One materialization per report."""
    rows = sum(p.position for p in outcome.committed.state.partitions.values())
    return [
        dg.AssetMaterialization(binding.key, partition=str(r.partition_id), metadata=report_metadata(r, outcome, rows))
        for r in reports
    ]


def sync_observation(
    binding: FeedBinding, outcome: LoadOutcome, logger: dg.DagsterLogManager | None = None
) -> dg.AssetObservation:
    """One observation of the asset per load, whatever its number of partitions: when it was synced,
    what it brought, and (where the protocol says) how many events the feed holds past the cursors
    of record now."""
    reports = outcome.reports.values()
    metadata: dict[str, RawMetadataValue] = {
        "last_synced": dg.MetadataValue.timestamp(time.time()),
        "partitions_synced": sum(r.status in SUCCEEDED for r in reports),
        "partitions_with_new_events": sum(r.status == "loaded" and r.events > 0 for r in reports),
        "partitions_failed": sum(r.status not in SUCCEEDED for r in reports),
        "events_loaded": sum(r.events for r in reports if r.status == "loaded"),
        "delta_version": outcome.committed.delta_version if outcome.committed.delta_version is not None else -1,
    }
    if (behind := events_behind(binding, outcome, logger)) is not None:
        metadata["events_behind"] = behind
    return dg.AssetObservation(binding.key, metadata=metadata)


def events_behind(binding: FeedBinding, outcome: LoadOutcome, logger: dg.DagsterLogManager | None = None) -> int | None:
    """Events the feed holds past the cursors of record, summed over its partitions, from a discovery
    made now; None where the protocol cannot tell (FeedAPI) or the discovery failed."""
    state = outcome.committed.state
    client = binding.feed.client()
    try:
        if not client.protocol.tells_newest_events:
            return None
        partitions = client.discover().partitions
        cursors = {partition_id: own.cursor for partition_id, own in state.partitions.items()}
        counts = [client.protocol.events_behind(p, cursors.get(p.id, FIRST)) for p in partitions]
    except ProtocolError as error:
        if logger is not None:
            logger.warning("how far behind the feed the table is is unknown: discovery failed (%s)", error)
        return None
    finally:
        client.close()
    known = [count for count in counts if count is not None]
    return sum(known) if len(known) == len(counts) else None


def latest_metadata_by_partition(
    instance: dg.DagsterInstance, binding: FeedBinding, partition_keys: Sequence[str]
) -> dict[str, dict]:
    """The metadata of each partition's latest materialization (partitions without one are left out),
    in two queries whatever the number of partitions."""
    # DagsterInstance has no public lookup of each partition's latest materialization; this storage
    # method is the one Dagster's own partition status uses (one query for all the keys)
    latest = instance.event_log_storage.get_latest_storage_id_by_partition(
        binding.key, dg.DagsterEventType.ASSET_MATERIALIZATION, set(partition_keys)
    )
    if not latest:
        return {}
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=binding.key, storage_ids=list(latest.values())), limit=len(latest)
    ).records
    metadata: dict[str, dict] = {}
    for record in records:
        # materializations of the partitions in `latest`, fetched by their storage ids
        materialization = record.asset_materialization
        assert record.partition_key is not None and materialization is not None
        metadata[record.partition_key] = {k: v.value for k, v in materialization.metadata.items()}
    return metadata


def mirror_repairs(
    binding: FeedBinding, outcome: LoadOutcome, latest: dict[str, dict], skip: Iterable[int]
) -> list[dg.AssetMaterialization]:
    """Materializations for partitions whose latest one (`latest`, by partition key) disagrees with the
    cursor of record in Delta (a run killed between its commit and its materialization): the next run
    sets the mirror right."""
    skip = set(skip)
    candidates = {
        partition_id: state
        for partition_id, state in sorted(outcome.committed.state.partitions.items())
        if partition_id not in skip and outcome.info.partition(partition_id) is not None
    }
    repairs = []
    for partition_id, state in candidates.items():
        mirrored = latest.get(str(partition_id), {})
        if mirrored.get("cursor") == state.cursor and mirrored.get("drained") == state.drained:
            continue
        report = PartitionReport.unmoved(partition_id=partition_id, status=LoadStatus.LOADED, state=state)
        repairs.extend(materializations(binding, [report], outcome))
    return repairs


@contextmanager
def failing_clearly(feed: str, what: str) -> Iterator[None]:
    """A `ProtocolError` (the feed's server refused, retries ran out, an answer came cut short every
    time) as a `dg.Failure` of one line naming feed `feed` and `what` failed, without the chain of
    `requests` and `urllib3` exceptions beneath it: the client logged each attempt's."""
    try:
        yield
    except ProtocolError as error:
        raise dg.Failure(f"feed {feed}: {what} failed: {error}") from None


def failure(binding: FeedBinding, reports: Iterable[PartitionReport]) -> dg.Failure | None:
    problems = [f"partition {r.partition_id}: {r.error}" for r in reports if r.status in ("failed", "invalid")]
    if not problems:
        return None
    return dg.Failure(
        description=f"feed {binding.name}: {len(problems)} partition(s) could not be loaded "
        "(what was committed before the failure is kept): " + "; ".join(problems),
        allow_retries=True,
    )


def maintenance_observation(binding: FeedBinding, report: MaintenanceReport) -> dg.AssetObservation:
    """The maintenance on the asset's page: what ran, the retention it used, the files it removed."""
    metadata: dict[str, RawMetadataValue] = {
        "maintenance": ", ".join(report.operations),
        "delta_version": report.delta_version if report.delta_version is not None else -1,
    }
    if report.retention_hours is not None:
        metadata["vacuum_retention_hours"] = report.retention_hours
    if report.files_removed is not None:
        metadata["files_removed"] = report.files_removed
    return dg.AssetObservation(binding.key, metadata=metadata)
