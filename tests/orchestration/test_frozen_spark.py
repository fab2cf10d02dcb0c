"""A run that starts while the embedded Spark Connect server is frozen (SIGSTOP: its port still takes
connections, the kernel accepts them, but nothing answers) ends within the feed's
`load.spark_unresponsive_seconds`, with `SparkUnresponsive`, and its process exits: its first call to
the server (the session's set-up) is watched as the load's are. Before, the run hung in the set-up
(pyspark's Connect client waits, then retries for 10 minutes; its exit hook called the server again)."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
from dagster._core.instance.ref import InstanceRef

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from tests.user_project import MODULE, write_user_project

BOUND = 10  # seconds: the feed's `load.spark_unresponsive_seconds`
FROZEN_CHECK_RUN = Path(__file__).with_name("frozen_check_run.py")


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
    calls do; the load's commit stays. The run (in a process of its own: a Connect session cannot start
    beside this worker's classic one) has a check of its own (`@feed_check`) that freezes the server and
    asks it something, so the moment is exact."""
    with DemoFeedServer(DemoFeed(partitions=1, events=50, seed=12), dialect="published") as server:
        command = [sys.executable, str(FROZEN_CHECK_RUN), server.url, str(connect_server.port), str(connect_server.pid)]
        command += [str(tmp_path / "lakehouse"), str(BOUND)]
        try:
            # without a bound on the checks the run waits for ever
            out = subprocess.run(command, capture_output=True, text=True, timeout=180)
        finally:
            os.killpg(connect_server.pid, signal.SIGCONT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert not said["success"]
    message = said["failure"]
    assert message.startswith("feedapi_dagster.errors.SparkUnresponsive: the table of feed orders: "), message
    assert f"(bound: {BOUND} s)" in message, message
    assert said["position"] == 50  # what the load committed before the checks stays
    print(f"the run ended {said['ended_after']:.1f} s after the check froze the server")
