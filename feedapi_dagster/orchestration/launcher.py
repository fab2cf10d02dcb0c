"""A run launcher that forks run workers from a warm process instead of starting fresh interpreters.

Dagster's default launcher has the code server start every run in a new interpreter, which then
imports Dagster, the instance's storage (sqlalchemy, alembic) and the data libraries before the first
step: about 2 s per run on 2 cores, as long as the sync of 400k events itself. This launcher keeps a
fork server (Python's `multiprocessing` forkserver) that imported those modules once; each run is a
fork of it that loads the code location and runs exactly what `dagster api execute_run` runs.

Project code is deliberately not preloaded: each run imports the code location (and so this library
and the feeds file) afresh, so a reloaded code location is what runs. Runs whose code location uses
another Python (a different venv), and every run where Python cannot fork (Windows), are launched as
the default launcher launches them, through the code server.
"""
from __future__ import annotations

import json
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Self

from dagster._config.config_schema import UserConfigSchema
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, WorkerStatus
from dagster._core.launcher.default_run_launcher import DefaultRunLauncher
from dagster._core.storage.dagster_run import DagsterRun
from dagster._serdes.config_class import ConfigurableClassData

# where a forked run's worker is: {"host": ..., "pid": ..., "started": <kernel start time of the pid>}
WORKER_TAG = "feedapi/run_worker"

# What a run process spends its start-up importing, measured with `python -X importtime` on a run.
DEFAULT_PRELOAD: tuple[str, ...] = (
    "dagster",
    "dagster._cli.api",
    "dagster._core.storage.runs.sqlite.sqlite_run_storage",
    "dagster._core.storage.event_log.sqlite.sqlite_event_log",
    "dagster._core.storage.schedules.sqlite.sqlite_schedule_storage",
    "dagster._core.execution.api",
    "dagster_pyspark",
    "sqlalchemy",
    "alembic",
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.dataset",
    "deltalake",
    "msgspec",
    "requests",
    "pydantic",
    "yaml",
    # this library (protocol, planning, lakehouse, orchestration: ~0.15 s of a run's start); the code
    # location that uses it (`dagster_project`, the feeds file) is still loaded afresh by every run
    "feedapi_dagster.orchestration",
)


# imported by the fork server after the preloads: Dagster's migration scripts read once (see the module)
WARM_STORAGE = "feedapi_dagster.orchestration.warm_storage"


class ForkServerRunLauncher(DefaultRunLauncher):
    """Launches each run in a process forked from a fork server with Dagster already imported.

    In `dagster.yaml`:

        run_launcher:
          module: feedapi_dagster.orchestration.launcher
          class: ForkServerRunLauncher
          config:
            preload_modules: [...]   # optional; DEFAULT_PRELOAD otherwise

    The fork server starts with the first run this process launches (the daemon, under the queued
    run coordinator) and inherits that process's environment. Run monitoring works through
    `check_run_worker_health`: a forked worker that died while its run was still going is reported.
    """

    def __init__(self, inst_data: ConfigurableClassData | None = None,
                 preload_modules: Sequence[str] = DEFAULT_PRELOAD):
        super().__init__(inst_data=inst_data)
        self._preload = list(preload_modules)
        self._context: Any = None
        self._workers: dict[str, multiprocessing.process.BaseProcess] = {}

    @classmethod
    def config_type(cls) -> UserConfigSchema:
        from dagster import Array, Field

        return {"preload_modules": Field(Array(str), is_required=False,
                                         description="Modules the fork server imports once for every run.")}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> Self:
        return cls(inst_data=inst_data, preload_modules=config_value.get("preload_modules", DEFAULT_PRELOAD))

    def start_fork_server(self) -> None:
        """Start the fork server now (it imports in the background) rather than at the first launch."""
        if self._context is None:
            context = multiprocessing.get_context("forkserver")
            # the storage warm-up is not a preload the configuration can drop: it is part of the launcher
            context.set_forkserver_preload([*self._preload, WARM_STORAGE])
            multiprocessing.forkserver.ensure_running()
            self._context = context

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        origin = run.job_code_origin
        if (origin is None or os.path.abspath(origin.executable_path) != os.path.abspath(sys.executable)
                or "forkserver" not in multiprocessing.get_all_start_methods()):  # Windows has no fork
            super().launch_run(context)
            return
        self.start_fork_server()
        for run_id in [r for r, worker in self._workers.items() if not worker.is_alive()]:
            del self._workers[run_id]
        working_directory = getattr(origin.repository_origin.code_pointer, "working_directory", None)
        worker = self._context.Process(target=execute_forked_run, name=f"dagster-run-{run.run_id}",
                                       args=(run.run_id, self._instance.get_ref(), working_directory))
        worker.start()
        pid = worker.pid
        self._instance.add_run_tags(run.run_id, {WORKER_TAG: json.dumps(
            {"host": socket.gethostname(), "pid": pid, "started": _process_started(pid)})})
        self._workers[run.run_id] = worker
        self._run_ids.add(run.run_id)

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id) if self.has_instance else None
        if run is None or WORKER_TAG not in run.tags:
            return super().terminate(run_id)
        if run.is_finished:
            return False
        self._instance.report_run_canceling(run)
        pid = _live_worker_pid(run)
        if pid is None:
            self._instance.report_engine_event("The run's worker process is not running.", dagster_run=run,
                                               cls=self.__class__)
            return False
        # the worker turns SIGINT into a cancellation between steps' operations, as the code server's does
        os.kill(pid, signal.SIGINT)
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        if WORKER_TAG not in run.tags:
            # launched through the code server, which has no health check: nothing to say
            return CheckRunHealthResult(WorkerStatus.RUNNING, "not a forked run worker")
        worker = json.loads(run.tags[WORKER_TAG])
        if worker["host"] != socket.gethostname():
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, f"the run worker is on host {worker['host']}")
        if _live_worker_pid(run) is None:
            return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker process {worker['pid']} is gone",
                                        run_worker_id=str(worker["pid"]))
        return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=str(worker["pid"]))

    def dispose(self) -> None:
        # The fork server is this process's; its run workers are not its children and keep running.
        if self._context is not None:
            multiprocessing.forkserver._forkserver._stop()
            self._context = None


def execute_forked_run(run_id: str, instance_ref: Any, working_directory: str | None) -> None:
    """The run worker, in the forked process: what `dagster api execute_run` does with its arguments."""
    from dagster import DagsterInstance
    from dagster._cli.api import _execute_run_command_body
    from dagster._utils.interrupts import capture_interrupts

    if working_directory:
        os.chdir(working_directory)
    with capture_interrupts(), DagsterInstance.from_ref(instance_ref) as instance:
        code = _execute_run_command_body(run_id, instance, lambda _event: None, set_exit_code_on_failure=True)
    sys.exit(code)


def _process_stat(pid: int | None) -> tuple[str, int] | None:
    """The state and kernel start time of `pid` (Linux): a reused pid is not taken for the worker, nor
    a zombie for a live one."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _process_started(pid: int | None) -> int | None:
    stat = _process_stat(pid)
    return stat[1] if stat else None


def _live_worker_pid(run: DagsterRun) -> int | None:
    worker = json.loads(run.tags[WORKER_TAG])
    pid = worker["pid"]
    stat = _process_stat(pid)
    if stat is None:  # gone, or no /proc to tell
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return pid
    state, started = stat
    if state == "Z" or (worker.get("started") is not None and started != worker["started"]):
        return None
    return pid
