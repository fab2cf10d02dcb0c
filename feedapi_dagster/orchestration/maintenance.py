"""Delta maintenance of a feed's table in Dagster: OPTIMIZE and VACUUM after the loads' commits (every
N commits, in the load's step) and on a schedule of its own (`maintenance.cron`, a job of its own).

VACUUM's retention is never below the feed's time-travel window nor below the age of the oldest load
of the feed that may still write: runs in progress, and runs that failed or were canceled within the
margin (a killed run's Spark job can still commit after it). The maintenance job is in the feed's
pool, so with the shipped `concurrency` settings it never runs beside a load.
"""

import datetime as dt

import dagster as dg

from feedapi_dagster.lakehouse.delta import FeedTable
from feedapi_dagster.lakehouse.delta_maintenance import RUNNING_LOAD_MARGIN_HOURS, MaintenanceReport, due, maintain

from .loads import FeedBinding, runs_loading

_ENDED = [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]


def oldest_running_load(instance: dg.DagsterInstance, binding: FeedBinding,
                        exclude_run_id: str | None = None) -> dt.datetime | None:
    """When the oldest load of the feed that may still write started (None: there is none)."""
    recently = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=RUNNING_LOAD_MARGIN_HOURS)
    records = [*runs_loading(instance, binding, exclude_run_id),
               *runs_loading(instance, binding, exclude_run_id,
                             dg.RunsFilter(statuses=_ENDED, updated_after=recently))]
    starts = [record.start_time or record.create_timestamp.timestamp() for record in records]
    return dt.datetime.fromtimestamp(min(starts), dt.timezone.utc) if starts else None


def report_observation(binding: FeedBinding, report: MaintenanceReport) -> dg.AssetObservation:
    """The maintenance on the asset's page: what ran, the retention it used, the files it removed."""
    metadata: dict[str, dg.RawMetadataValue] = {
        "maintenance": ", ".join(report.operations),
        "delta_version": report.delta_version if report.delta_version is not None else -1,
    }
    if report.retention_hours is not None:
        metadata["vacuum_retention_hours"] = report.retention_hours
    if report.files_removed is not None:
        metadata["files_removed"] = report.files_removed
    return dg.AssetObservation(binding.key, metadata=metadata)


def build_maintenance_job(binding: FeedBinding) -> dg.JobDefinition:
    feed = binding.feed

    @dg.op(name=f"feedapi_{feed.name}_maintenance_op", required_resource_keys={binding.spark_key},
           pool=f"feedapi_{feed.name}", tags={"kind": "delta"})
    def maintenance_op(context: dg.OpExecutionContext) -> None:
        table = binding.table(context)
        table.ensure_table()
        running = oldest_running_load(context.instance, binding, exclude_run_id=context.run.run_id)
        report = maintain(table, feed.maintenance, running)
        context.log.info("feed %s: %s", feed.name, report)
        context.log_event(report_observation(binding, report))

    @dg.job(name=f"feedapi_{feed.name}_maintenance", tags={"feedapi/maintenance": feed.name},
            executor_def=dg.in_process_executor,
            description=f"OPTIMIZE and VACUUM of the Delta table of feed `{feed.name}` (by Spark).")
    def maintenance_job():
        maintenance_op()

    return maintenance_job


def build_maintenance_schedule(binding: FeedBinding, job: dg.JobDefinition) -> dg.ScheduleDefinition | None:
    cron = binding.feed.maintenance.cron
    if cron is None:
        return None
    return dg.ScheduleDefinition(
        name=f"feedapi_{binding.name}_maintenance_schedule", cron_schedule=cron, job=job,
        default_status=dg.DefaultScheduleStatus.RUNNING if binding.feed.schedule.enabled
        else dg.DefaultScheduleStatus.STOPPED,
        description=f"OPTIMIZE and VACUUM of feed `{binding.name}`'s table.")


def maintain_after_load(context: dg.AssetExecutionContext, binding: FeedBinding, table: FeedTable) -> None:
    """What the loads' commits made due: OPTIMIZE every `optimize_every_commits` commits, VACUUM every
    `vacuum_every_commits`."""
    operations = due(table, binding.feed.maintenance)
    if not operations:
        return
    running = oldest_running_load(context.instance, binding, exclude_run_id=context.run.run_id)
    report = maintain(table, binding.feed.maintenance, running, operations)
    context.log.info("feed %s: %s", binding.name, report)
    context.log_event(report_observation(binding, report))
