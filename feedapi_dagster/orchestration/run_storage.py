"""What the Dagster instance knows that a load asks: the runs loading a feed and the partitions each
loads, read from its tags (to keep two runs off one partition, and VACUUM off what a load may still
write), each partition's latest materialization (the
mirror of the cursor of record), and the positions check's last count of users' DELETEs. Two of
these read storage methods beneath `DagsterInstance` (said where), all of them here."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

import dagster as dg
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from feedapi_dagster.lakehouse.deletes import UserDeletes
from feedapi_dagster.lakehouse.maintenance import RUNNING_LOAD_MARGIN_HOURS

from .checks import CONTIGUOUS, PositionsChecked
from .loads import FEED_TAG, PARTITIONS_TAG, RANGE_END_TAG, RANGE_START_TAG, FeedBinding
from .metadata import PartitionMetadata, UnreadableMetadata

ACTIVE_STATUSES = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
_IN_PROGRESS = dg.RunsFilter(statuses=ACTIVE_STATUSES)
_ENDED = [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]


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


def latest_metadata_by_partition(
    instance: dg.DagsterInstance, binding: FeedBinding, partition_keys: Sequence[str]
) -> dict[str, PartitionMetadata]:
    """The metadata of each partition's latest materialization, in two queries whatever the number of
    partitions. Left out: partitions without one, and those whose metadata is not a
    `PartitionMetadata` (written by an older release, or by hand): to a load they are not mirrored
    yet, and it logs them a materialization that is (`metadata.mirror_repairs`)."""
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
    metadata: dict[str, PartitionMetadata] = {}
    for record in records:
        materialization = record.asset_materialization
        if record.partition_key is None or materialization is None:
            continue  # not a partition's materialization: none of those fetched by their storage ids
        try:
            metadata[record.partition_key] = PartitionMetadata.read(materialization.metadata)
        except UnreadableMetadata:
            continue
    return metadata


def recorded_user_deletes(instance: dg.DagsterInstance, key: dg.AssetKey) -> UserDeletes | None:
    """The count of users' DELETEs the feed's latest positions check recorded (None: none did, or
    its record is not a `PositionsChecked`: the count then starts from the Delta log)."""
    # DagsterInstance has no public read of a check's latest evaluation with its metadata; this storage
    # method (and its status enum, imported from dagster._core) is what the UI's check history uses
    evaluated = {AssetCheckExecutionRecordStatus.SUCCEEDED, AssetCheckExecutionRecordStatus.FAILED}
    records = instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(key, CONTIGUOUS), limit=1, status=evaluated
    )
    event = records[0].event.dagster_event if records and records[0].event else None
    if event is None:
        return None
    # a SUCCEEDED or FAILED record's event is the check's evaluation (the record's constructor says so)
    try:
        return PositionsChecked.read(event.asset_check_evaluation_data.metadata).user_deletes()
    except UnreadableMetadata:
        return None
