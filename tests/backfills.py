"""Backfills as the UI launches them ("Materialize selected" over partitions of an asset): recorded in
the instance, for the daemon's backfill loop to run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
from dagster._core.execution.backfill import BULK_ACTION_TERMINAL_STATUSES, PartitionBackfill
from dagster._core.utils import make_new_backfill_id

from .user_project import importable


def launch_backfill(instance: dg.DagsterInstance, project: Path, key: dg.AssetKey, partitions: list[str]) -> str:
    """A backfill of `key` over `partitions` of the user's project at `project`, recorded as the UI's
    launch records it (the daemon's backfill loop launches its runs); its id."""
    with importable(project):
        asset_graph = dg.load_from_defs_folder(path_within_project=project).resolve_asset_graph()
    backfill_id = make_new_backfill_id()
    instance.add_backfill(
        PartitionBackfill.from_asset_partitions(
            backfill_id=backfill_id,
            asset_graph=asset_graph,
            partition_names=partitions,
            asset_selection=[key],
            backfill_timestamp=time.time(),
            tags={},
            dynamic_partitions_store=instance,
            all_partitions=False,
            title=None,
            description=None,
            run_config=None,
        )
    )
    return backfill_id


def wait_for_backfill(
    instance: dg.DagsterInstance, backfill_id: str, daemon: subprocess.Popen, log: Path, timeout: float = 300.0
) -> PartitionBackfill:
    """The backfill once it ended (the daemon, whose log is `log`, must keep running meanwhile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert daemon.poll() is None, f"the daemon exited: {log.read_text()[-3000:]}"
        backfill = instance.get_backfill(backfill_id)
        if backfill.status in BULK_ACTION_TERMINAL_STATUSES:
            return backfill
        time.sleep(1)
    raise AssertionError(f"backfill {backfill_id} did not end within {timeout:.0f} s: {log.read_text()[-3000:]}")


@contextlib.contextmanager
def running_daemon(project: Path, home: Path, log_path: Path) -> Iterator[subprocess.Popen]:
    """`dagster-daemon run` on the project's workspace and the instance at `home` (its sensors,
    schedules, run queue and backfills), stopped at the end."""
    env = {**os.environ, "DAGSTER_HOME": str(home), "ORDERS_FEED_TOKEN": "unused-by-the-demo-server"}
    with open(log_path, "wb") as log:
        daemon = subprocess.Popen(
            [str(Path(sys.executable).with_name("dagster-daemon")), "run", "-w", str(project / "workspace.yaml")],
            cwd=project,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield daemon
        finally:
            os.killpg(daemon.pid, signal.SIGTERM)
            daemon.wait(timeout=60)
