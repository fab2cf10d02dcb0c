"""The Delta maintenance job of a feed's table and its schedule (`maintenance.cron`): OPTIMIZE and VACUUM
by `FeedApiResource.maintain`, which the loads also run after the commits that make them due.

VACUUM's retention is never below the feed's time-travel window nor below the age of the oldest load
of the feed that may still write (`run_storage.oldest_running_load`). The maintenance job is in the feed's
pool, so with the shipped `concurrency` settings it never runs beside a load.
"""

import dagster as dg

from .loads import MAINTENANCE_TAG, FeedBinding
from .resources import FeedApiResource


def build_maintenance_job(binding: FeedBinding) -> dg.JobDefinition:
    feed = binding.feed

    @dg.op(name=f"feedapi_{feed.name}_maintenance_op", pool=binding.pool, tags={"kind": "delta"})
    def maintenance_op(context: dg.OpExecutionContext, feedapi: FeedApiResource) -> None:
        context.log_event(feedapi.maintain(context, binding))

    @dg.job(
        name=f"feedapi_{feed.name}_maintenance",
        tags={MAINTENANCE_TAG: feed.name},
        executor_def=dg.in_process_executor,
        description=f"OPTIMIZE and VACUUM of the Delta table of feed `{feed.name}` (by Spark).",
    )
    def maintenance_job():
        maintenance_op()

    return maintenance_job


def build_maintenance_schedule(binding: FeedBinding, job: dg.JobDefinition) -> dg.ScheduleDefinition | None:
    cron = binding.feed.maintenance.cron
    if cron is None:
        return None
    return dg.ScheduleDefinition(
        name=f"feedapi_{binding.name}_maintenance_schedule",
        cron_schedule=cron,
        job=job,
        default_status=dg.DefaultScheduleStatus.RUNNING
        if binding.feed.schedule.enabled
        else dg.DefaultScheduleStatus.STOPPED,
        description=f"OPTIMIZE and VACUUM of feed `{binding.name}`'s table.",
    )
