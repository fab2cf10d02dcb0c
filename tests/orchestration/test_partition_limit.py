"""The shipped dagster.yaml holds runs of one partition of a feed one at a time, and not runs of the same
partition key of two feeds (issue 35): Dagster's run queue, configured by that file, on a real instance
with queued runs tagged as the feeds' sensors and schedules tag them (`partition_run_tags`)."""

import shutil
from dataclasses import dataclass

import dagster as dg

# the run queue's own choice of runs to launch: Dagster has no public API for it (its daemon's loop
# launches them too, which needs a code location)
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

from feedapi_dagster.orchestration.demo_commands import INSTANCE_TEMPLATE
from feedapi_dagster.orchestration.loads import SCHEDULED_SYNC, SYNC_TAG, partition_run_tags


@dataclass(frozen=True)
class _Binding:
    name: str


def test_partition_0_of_two_feeds_run_together_and_two_runs_of_one_are_held(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(INSTANCE_TEMPLATE, home / "dagster.yaml")
    order = ["0", "1"]
    with dg.DagsterInstance.from_config(str(home)) as instance:

        def queued(feed: str, **extra: str) -> str:
            tags = {**partition_run_tags(_Binding(feed), [0], order), **extra}
            # as a launch leaves it in the run storage: queued, with its tags and the job's origin (a code
            # location that the queue's choice does not open)
            job = f"feedapi_{feed}_load"
            origin = RemoteJobOrigin(
                RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("project"), "__repository__"), job
            )
            run = dg.DagsterRun(job_name=job, status=dg.DagsterRunStatus.QUEUED, tags=tags, remote_job_origin=origin)
            return instance.add_run(run).run_id

        discovery = queued("orders")
        scheduled = queued("orders", **{SYNC_TAG: SCHEDULED_SYNC})
        other_feed = queued("payments")
        daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)
        dequeued = [
            run.run_id for run in daemon._get_runs_to_dequeue(instance, instance.get_concurrency_config(), None)
        ]
    assert sorted(dequeued) == sorted([discovery, other_feed]), (dequeued, scheduled)
