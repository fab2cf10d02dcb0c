"""A run that starts while the embedded Spark Connect server is frozen (SIGSTOP: its port still takes
connections, the kernel accepts them, but nothing answers) ends within the feed's
`load.spark_unresponsive_seconds`, with `SparkUnresponsive`, and its process exits: its first call to
the server (the session's set-up) is watched as the load's are. Before, the run hung in the set-up
(pyspark's Connect client waits, then retries for 10 minutes; its exit hook called the server again)."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
from dagster._core.instance.ref import InstanceRef

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.lakehouse import LoadSettings
from feedapi_dagster.orchestration import FeedConfig, ProjectConfig, build_feedapi_definitions
from feedapi_dagster.orchestration.checks import FEED_CHECKS, CheckedLoad, feed_check
from feedapi_dagster.spark.settings import SparkSettings
from tests.user_project import MODULE, write_user_project

BOUND = 10  # seconds: the feed's `load.spark_unresponsive_seconds`


def test_a_run_that_starts_while_spark_is_frozen_fails_within_its_bound(tmp_path, connect_server):
    home = tmp_path / "dagster_home"
    home.mkdir()
    with (
        DemoFeedServer(DemoFeed(partitions=1, events=50, seed=12), dialect="published") as server,
        dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance,
    ):
        project = write_user_project(
            tmp_path / "project",
            server.url,
            {"mode": "embedded", "port": connect_server.port},  # the tests' shared server
            lakehouse=tmp_path / "lakehouse",
            feed={"load": {"spark_unresponsive_seconds": BOUND}},
        )
        instance.add_dynamic_partitions("feedapi_orders", ["0"])
        # frozen for the run only (tens of seconds: well within Spark's own timeouts), then woken up
        os.killpg(connect_server.pid, signal.SIGSTOP)
        try:
            took, out, returncode = _run_in_its_own_process(project, home)
        finally:
            os.killpg(connect_server.pid, signal.SIGCONT)
        (run,) = instance.get_runs()
        (step_started,) = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_START)
        (step_failed,) = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    assert returncode != 0, out[-3000:]
    assert run.status == dg.DagsterRunStatus.FAILURE  # its slot is free
    # the asset's error, under Dagster's "Error occurred while executing op"
    message = step_failed.dagster_event.step_failure_data.error.cause.message
    assert message.startswith("feedapi_dagster.errors.SparkUnresponsive: the set-up of the Spark session: ")
    assert f"did not answer for {BOUND} s (bound: {BOUND} s)" in message, message
    assert message.count("\n") <= 1, message  # one line (and Dagster's newline)
    # the step: the bound, a second to notice, the client's close; the run's processes: Python, Dagster
    # and the project's imports (twice: the run's and its step's) on a loaded 2-core machine besides
    failed_after = step_failed.timestamp - step_started.timestamp
    assert failed_after < BOUND + 8, failed_after
    assert took < 120, took
    print(f"step failed after {failed_after:.1f} s, the run's process ended after {took:.1f} s")


def _run_in_its_own_process(project: Path, home: Path) -> tuple[float, str, int]:
    """A run of the feed's partition 0 in a process of its own, as a launcher starts one (its step in a
    subprocess: Dagster's multiprocess executor): how long the process took to end by itself, its
    output and exit code. Its processes are killed when they hang."""
    started = time.monotonic()
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("dagster")), "asset", "materialize"]
        + ["-m", f"{MODULE}.definitions", "--select", "feedapi/orders", "--partition", "0"],
        cwd=project,
        env={**os.environ, "DAGSTER_HOME": str(home), "ORDERS_FEED_TOKEN": "unused-by-the-demo-server"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = process.communicate(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return time.monotonic() - started, out, process.returncode


def test_a_server_frozen_while_the_checks_run_fails_the_run_within_its_bound(tmp_path, connect_server):
    """The checks after a load ask Spark too (the duplicates of an at-least-once feed, statistics
    delta-rs cannot read): a server frozen then fails the step within the bound, as the load's own
    calls do; the load's commit stays. A check of this test's own (`@feed_check`) freezes the server
    and asks it, so the moment is exact."""

    @feed_check("freezes_spark", "freezes the Spark server, then asks it something")
    def freezes_spark(load: CheckedLoad) -> dg.AssetCheckResult:
        os.killpg(connect_server.pid, signal.SIGSTOP)
        load.outcome.table.spark.sql("SELECT 1").collect()
        return dg.AssetCheckResult(passed=True)

    outcome: dict[str, object] = {}
    with (
        DemoFeedServer(DemoFeed(partitions=1, events=50, seed=12), dialect="published") as server,
        dg.instance_for_test() as instance,
    ):
        project = ProjectConfig(
            lakehouse=str(tmp_path / "lakehouse"),
            spark=SparkSettings(mode="embedded", port=connect_server.port),
            feeds=[FeedConfig(name="orders", url=server.url, load=LoadSettings(spark_unresponsive_seconds=BOUND))],
        )
        defs = build_feedapi_definitions(project)
        instance.add_dynamic_partitions("feedapi_orders", ["0"])

        def materialize() -> None:
            started = time.monotonic()
            outcome["result"] = dg.materialize(
                [defs.get_assets_def(dg.AssetKey(["feedapi", "orders"]))],
                partition_key="0",
                instance=instance,
                resources=defs.resources,
                raise_on_error=False,
            )
            outcome["took"] = time.monotonic() - started

        run = threading.Thread(target=materialize, daemon=True)
        try:
            run.start()
            run.join(timeout=180)  # without a bound on the checks: for ever
        finally:
            os.killpg(connect_server.pid, signal.SIGCONT)
            del FEED_CHECKS["freezes_spark"]
        assert not run.is_alive(), "the run still waits for the frozen server"
        result = outcome["result"]
        assert isinstance(result, dg.ExecuteInProcessResult) and not result.success
        (failure,) = [event for event in result.all_events if event.is_step_failure]
        message = failure.step_failure_data.error.cause.message
        assert message.startswith("feedapi_dagster.errors.SparkUnresponsive: the table of feed orders: "), message
        assert f"(bound: {BOUND} s)" in message, message
        # what the load committed before the checks stays (its materialization was logged first)
        (materialized,) = result.asset_materializations_for_node("feedapi__orders")
        assert materialized.metadata["position"].value == 50
        print(f"the run failed after {outcome['took']:.1f} s")
