"""The discovery sensor and the sync schedule of a feed."""

import hashlib

import dagster as dg
from pydantic import BaseModel, Field

from feedapi_dagster.protocol import FeedAPIError, FeedInfo

from .config import FeedConfig
from .loads import active_partitions, latest_metadata_by_partition, partitions_def_name, sync_run_tags


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


def sync_request(feed: FeedConfig, partitions: list[int], reason: str, *, rebuild: list[int] = (),
                 drop: list[int] = ()) -> dg.RunRequest:
    config = {"partitions": sorted(partitions), "rebuild": sorted(rebuild), "drop": sorted(drop)}
    # the same intent on the same discovery state gives the same key: Dagster launches it once
    digest = hashlib.sha256(f"{reason}:{config}".encode()).hexdigest()[:16]
    return dg.RunRequest(
        run_key=f"{reason}-{digest}",
        run_config={"ops": {f"feedapi_{feed.name}_sync_op": {"config": config}}},
        tags=sync_run_tags(feed, [*partitions, *rebuild, *drop], rebuild=bool(rebuild)),
    )


def evaluate_discovery(feed: FeedConfig, info: FeedInfo, previous: DiscoveryCursor,
                       log: dg.DagsterLogManager | None = None) -> dg.SensorResult:
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
    requests = []
    if feed.schedule.rebuild_on_split and vanished and split_children:
        requests.append(sync_request(feed, [], f"split-rebuild-{info.token}", rebuild=split_children, drop=vanished))
        new = [pid for pid in new if pid not in split_children]
    # new partitions (method-2 children start from their ancestor's cursor, method-1 children wait
    # for their parent inside the run) and a final run for partitions that just closed
    due = sorted({*new, *newly_closed, *(by_id[pid].starts_after for pid in new if by_id[pid].starts_after is not None)})
    due = [pid for pid in due if pid in by_id]
    if due:
        requests.append(sync_request(feed, due, f"discovery-{info.token}"))
    if log is not None:
        for message in messages:
            log.info(message)
        if vanished:
            log.info("partitions %s vanished (method-2 split); their history stays in the table", vanished)
    return dg.SensorResult(
        run_requests=requests,
        cursor=current.model_dump_json(),
        dynamic_partitions_requests=[dg.AddDynamicPartitionsRequest(partitions_def_name(feed), [str(p) for p in new]),
                                     ] if new else [],
        skip_reason=None if requests or new else "no change in discovery",
    )


def build_discovery_sensor(feed: FeedConfig, sync_job: dg.JobDefinition) -> dg.SensorDefinition:
    @dg.sensor(
        name=f"feedapi_{feed.name}_discovery",
        job=sync_job,
        minimum_interval_seconds=feed.schedule.discovery_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING if feed.schedule.discovery_enabled
        else dg.DefaultSensorStatus.STOPPED,
        description=f"Polls discovery of feed `{feed.name}`: adds partitions, requests final loads of closed "
                    "partitions, handles splits.",
    )
    def discovery(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        client = feed.client()
        try:
            info = client.discover()
        except FeedAPIError as error:
            raise dg.Failure(f"feed {feed.name}: discovery failed: {error}") from None
        finally:
            client.close()
        return evaluate_discovery(feed, info, DiscoveryCursor.parse(context.cursor), context.log)

    return discovery


def register_discovered_partitions(instance: dg.DagsterInstance, feed: FeedConfig) -> list[str]:
    """Discovery over HTTP, its partitions added to `instance` as the discovery sensor adds them (for
    the demo, benchmarks and tests that run without the daemon); the feed's partition keys."""
    client = feed.client()
    try:
        result = evaluate_discovery(feed, client.discover(), DiscoveryCursor())
    finally:
        client.close()
    for request in result.dynamic_partitions_requests:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return instance.get_dynamic_partitions(partitions_def_name(feed))


def drained_partitions(instance: dg.DagsterInstance, feed: FeedConfig, keys: list[str]) -> set[str]:
    """Partitions whose latest materialization says they are closed and read to their end."""
    return {key for key, metadata in latest_metadata_by_partition(instance, feed, keys).items()
            if metadata.get("drained") is True}


def build_sync_schedule(feed: FeedConfig, sync_job: dg.JobDefinition) -> dg.ScheduleDefinition:
    @dg.schedule(
        name=f"feedapi_{feed.name}_schedule",
        cron_schedule=feed.schedule.cron,
        job=sync_job,
        default_status=dg.DefaultScheduleStatus.RUNNING if feed.schedule.enabled else dg.DefaultScheduleStatus.STOPPED,
        description=f"Loads every open partition of feed `{feed.name}` in one run.",
    )
    def sync_schedule(context: dg.ScheduleEvaluationContext):
        keys = context.instance.get_dynamic_partitions(partitions_def_name(feed))
        drained = drained_partitions(context.instance, feed, keys)
        busy = active_partitions(context.instance, feed)
        due = sorted(int(key) for key in keys if key not in drained and int(key) not in busy)
        if not due:
            return dg.SkipReason("no open partition to load" + (f" ({sorted(busy)} are being loaded)" if busy else ""))
        request = sync_request(feed, due, "schedule")
        return dg.RunRequest(run_config=request.run_config, tags=request.tags)

    return sync_schedule
