"""The discovery sensor and the sync schedule of a feed."""

import hashlib
import logging
from collections.abc import Sequence

import dagster as dg

# what `dg.define_asset_job` returns; dagster does not export its class
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition
from pydantic import BaseModel, Field

from feedapi_dagster.protocol import FeedInfo

from .loads import REBUILD_TAG, SCHEDULED_SYNC, SYNC_TAG, FeedBinding, failing_clearly, partition_run_tags
from .run_storage import ACTIVE_STATUSES, active_partitions, latest_metadata_by_partition


class DiscoveryCursor(BaseModel):
    """What the sensor saw last time: the discovery token and each partition's closed flag."""

    token: str | None = None
    partitions: dict[int, bool] = Field(default_factory=dict)

    @classmethod
    def parse(cls, text: str | None) -> "DiscoveryCursor":
        return cls.model_validate_json(text) if text else cls()

    @classmethod
    def of(cls, info: FeedInfo) -> "DiscoveryCursor":
        return cls(token=info.token, partitions={p.id: p.closed for p in info.partitions})


def load_request(
    binding: FeedBinding,
    partitions: Sequence[int],
    reason: str,
    order: Sequence[str],
    *,
    rebuild: Sequence[int] = (),
    drop: Sequence[int] = (),
) -> dg.RunRequest:
    """A run of the asset over `partitions` (`order`: the dynamic partition keys as the instance lists
    them, once this tick's new ones are added)."""
    config = {"rebuild": sorted(rebuild), "drop": sorted(drop)}
    # the same intent on the same discovery state gives the same key: Dagster launches it once
    digest = hashlib.sha256(f"{reason}:{sorted(partitions)}:{config}".encode()).hexdigest()[:16]
    tags = partition_run_tags(binding, partitions, order)
    if rebuild:
        tags[REBUILD_TAG] = "true"
    return dg.RunRequest(
        run_key=f"{reason}-{digest}",
        run_config={"ops": {binding.op_name: {"config": config}}} if rebuild or drop else {},
        tags=tags,
    )


def evaluate_discovery(
    binding: FeedBinding,
    info: FeedInfo,
    previous: DiscoveryCursor,
    known: Sequence[str],
    log: logging.Logger | None = None,
) -> dg.SensorResult:
    """`known`: the feed's dynamic partition keys in the instance, in its order."""
    current = DiscoveryCursor.of(info)
    by_id = {p.id: p for p in info.partitions}
    new = sorted(pid for pid in by_id if pid not in previous.partitions)
    newly_closed = sorted(pid for pid, p in by_id.items() if p.closed and previous.partitions.get(pid) is False)
    vanished = sorted(pid for pid in previous.partitions if pid not in by_id)
    split_children = sorted(pid for pid in new if by_id[pid].cursor_from)
    messages = []
    if previous.token is not None and info.token != previous.token:
        messages.append("discovery token changed: partitions rediscovered")
    for message in info.rejected:
        messages.append(message)
    added = [str(pid) for pid in new if str(pid) not in known]
    order = [*known, *added]
    requests = []
    if binding.feed.schedule.rebuild_on_split and vanished and split_children:
        requests.append(
            load_request(
                binding, split_children, f"split-rebuild-{info.token}", order, rebuild=split_children, drop=vanished
            )
        )
        new = [pid for pid in new if pid not in split_children]
    # new partitions (method-2 children start from their ancestor's cursor, method-1 children wait
    # for their parent inside the run) and a final run for partitions that just closed
    due = sorted({*new, *newly_closed, *(parent for pid in new if (parent := by_id[pid].starts_after) is not None)})
    due = [pid for pid in due if pid in by_id]
    # a feed in stream mode: its stream reads new partitions and closed ones' ends itself
    if due and binding.feed.schedule.mode == "batch":
        requests.append(load_request(binding, due, f"discovery-{info.token}", order))
    if log is not None:
        for message in messages:
            log.info(message)
        if vanished:
            log.info("partitions %s vanished (method-2 split); their history stays in the table", vanished)
    return dg.SensorResult(
        run_requests=requests,
        cursor=current.model_dump_json(),
        dynamic_partitions_requests=[dg.AddDynamicPartitionsRequest(binding.partitions_name, added)] if added else [],
        skip_reason=None if requests or added else "no change in discovery",
    )


def build_discovery_sensor(binding: FeedBinding, job: UnresolvedAssetJobDefinition) -> dg.SensorDefinition:
    feed = binding.feed

    @dg.sensor(
        name=f"feedapi_{feed.name}_discovery",
        job=job,
        minimum_interval_seconds=feed.schedule.discovery_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING
        if feed.schedule.discovery_enabled
        else dg.DefaultSensorStatus.STOPPED,
        description=f"Polls discovery of feed `{feed.name}`: adds partitions, requests final loads of closed "
        "partitions, handles splits.",
    )
    def discovery(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        with failing_clearly(feed.name, "discovery"), feed.client() as client:
            info = client.discover()
        known = context.instance.get_dynamic_partitions(binding.partitions_name)
        return evaluate_discovery(binding, info, DiscoveryCursor.parse(context.cursor), known, context.log)

    return discovery


def register_discovered_partitions(instance: dg.DagsterInstance, binding: FeedBinding) -> Sequence[str]:
    """Discovery over HTTP, its partitions added to `instance` as the discovery sensor adds them (for
    the demo, benchmarks and tests that run without the daemon); the feed's partition keys."""
    client = binding.feed.client()
    try:
        known = instance.get_dynamic_partitions(binding.partitions_name)
        result = evaluate_discovery(binding, client.discover(), DiscoveryCursor(), known)
    finally:
        client.close()
    assert result.dynamic_partitions_requests is not None  # `evaluate_discovery` gives a list, maybe empty
    for request in result.dynamic_partitions_requests:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return instance.get_dynamic_partitions(binding.partitions_name)


def drained_partitions(instance: dg.DagsterInstance, binding: FeedBinding, keys: Sequence[str]) -> set[str]:
    """Partitions whose latest materialization says they are closed and read to their end."""
    return {key for key, metadata in latest_metadata_by_partition(instance, binding, keys).items() if metadata.drained}


def build_load_schedule(
    binding: FeedBinding, job: UnresolvedAssetJobDefinition, stream_job: dg.JobDefinition
) -> dg.ScheduleDefinition:
    """The feed's schedule: a load of its open partitions per tick, or (`schedule.mode: stream`) a run
    of its stream job, an availableNow query."""
    feed = binding.feed
    status = dg.DefaultScheduleStatus.RUNNING if feed.schedule.enabled else dg.DefaultScheduleStatus.STOPPED

    def feed_schedule(target: UnresolvedAssetJobDefinition | dg.JobDefinition, description: str):
        """The feed's one schedule, whichever job it runs: its name, cron and status are the feed's."""
        return dg.schedule(
            name=f"feedapi_{feed.name}_schedule",
            cron_schedule=feed.schedule.cron,
            job=target,
            default_status=status,
            description=description,
        )

    if feed.schedule.mode == "stream":

        @feed_schedule(stream_job, f"Runs feed `{feed.name}`'s stream (an availableNow query) once per tick.")
        def stream_schedule(context: dg.ScheduleEvaluationContext):
            running = context.instance.get_run_records(
                dg.RunsFilter(job_name=stream_job.name, statuses=ACTIVE_STATUSES), limit=1
            )
            if running:
                return dg.SkipReason(f"run {running[0].dagster_run.run_id} of the stream is still running")
            return dg.RunRequest()

        return stream_schedule

    @feed_schedule(job, f"Loads every open partition of feed `{feed.name}` in one run of its asset.")
    def load_schedule(context: dg.ScheduleEvaluationContext):
        keys = context.instance.get_dynamic_partitions(binding.partitions_name)
        drained = drained_partitions(context.instance, binding, keys)
        busy = active_partitions(context.instance, binding)
        due = [int(key) for key in keys if key not in drained and int(key) not in busy]
        if not due:
            return dg.SkipReason("no open partition to load" + (f" ({sorted(busy)} are being loaded)" if busy else ""))
        request = load_request(binding, due, "schedule", keys)
        # a sync: its partitions with nothing new keep their materializations (`metadata.materialized_reports`)
        return dg.RunRequest(run_config=request.run_config, tags={**request.tags, SYNC_TAG: SCHEDULED_SYNC})

    return load_schedule
