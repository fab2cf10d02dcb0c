"""Delta maintenance through Dagster: loads run OPTIMIZE and VACUUM when their commits made them due
and say so on the asset; the maintenance job keeps the files a load that just failed may still write
(its Spark job can commit after the run died)."""

import dagster as dg
import pytest

from feedapi_dagster.orchestration.loads import FEED_TAG
from feedapi_dagster.orchestration.run_storage import oldest_running_load

from .test_flow import assert_exactly_once

EVERY_TWO_NO_WINDOW = {
    "maintenance": {"optimize_every_commits": 2, "vacuum_every_commits": 2, "time_travel_hours": 0, "cron": "0 3 * * *"}
}


def observations(harness) -> list[dict]:
    """The maintenance observations of the asset, newest first (each load also logs one of its sync)."""
    records = harness.instance.fetch_observations(dg.AssetKey(["feedapi", "orders"]), limit=50).records
    seen = [{k: v.value for k, v in r.asset_observation.metadata.items()} for r in records]
    return [metadata for metadata in seen if "maintenance" in metadata]


@pytest.mark.parametrize("harness", [EVERY_TWO_NO_WINDOW], indirect=True)
def test_loads_maintain_the_table_when_due_and_the_job_spares_a_failed_loads_files(spark, harness):
    assert harness.launch(harness.tick_sensor().run_requests[0]).success
    assert observations(harness) == []  # one commit: nothing due
    harness.feed.append(45)
    (request,) = harness.tick_schedule().run_requests
    run = harness.launch(request)
    assert run.success
    (seen,) = observations(harness)
    assert seen["maintenance"] == "OPTIMIZE, VACUUM" and seen["vacuum_retention_hours"] == 0
    assert seen["files_removed"] > 0  # the small files OPTIMIZE replaced, no time travel kept
    assert all(check.passed for check in run.get_asset_check_evaluations())
    assert_exactly_once(spark, harness, [0, 1, 2])

    # a load that failed just now: its Spark job may still commit files, the job keeps an hour more
    job = harness.defs.resolve_job_def("feedapi_orders_load")
    failed = harness.instance.create_run_for_job(job, tags={FEED_TAG: "orders"})
    harness.instance.report_run_failed(failed)
    assert oldest_running_load(harness.instance, harness.binding) is not None
    maintenance = harness.defs.resolve_job_def("feedapi_orders_maintenance").execute_in_process(
        instance=harness.instance, resources={}
    )
    assert maintenance.success
    latest = observations(harness)[0]
    assert latest["maintenance"] == "OPTIMIZE, VACUUM" and latest["vacuum_retention_hours"] >= 1
    assert latest["files_removed"] == 0
    assert_exactly_once(spark, harness, [0, 1, 2])
    schedule = harness.defs.resolve_schedule_def("feedapi_orders_maintenance_schedule")
    assert schedule.cron_schedule == "0 3 * * *" and schedule.job_name == "feedapi_orders_maintenance"
