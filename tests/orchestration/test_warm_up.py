"""The embedded Spark server warmed up before the first run waits for it (issue 38, "cold as warm").

Under `dg dev` / `dagster dev` (Dagster marks their processes with `DAGSTER_IS_DEV_CLI`), loading the
definitions starts the embedded server in a process of its own and warms it with scratch loads; the
first run waits for a warm-up still going and says in its log what was warmed and when. What the
warm-up buys is measured in `benchmarks/` (`bench_sync.py`, with and without `--no-warm-up`), not here.
"""

import fcntl
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.orchestration import FeedConfig, ProjectConfig, build_feedapi_definitions
from feedapi_dagster.orchestration.warm_up import (
    WARM_UP_EVENTS,
    log_warm_up,
    read_warm_up,
    warm_up_under_dagster_dev,
)
from feedapi_dagster.spark.connect_server import port_open
from feedapi_dagster.spark.embedded import stop_recorded_server
from feedapi_dagster.spark.server_record import read_record, remove_server_files, write_record
from feedapi_dagster.spark.settings import SparkSettings
from tests.ports import find_free_port


@pytest.mark.spark
def test_dagster_dev_loading_the_definitions_starts_and_warms_the_server_and_the_first_run_says_so(
    tmp_path: Path,
) -> None:
    port = find_free_port()  # nothing runs there: the definitions' load starts the server
    feed = DemoFeed(partitions=2, events=300, seed=5)
    with DemoFeedServer(feed, dialect="published") as server:
        try:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tests.orchestration.warm_up_run",
                    server.url,
                    str(port),
                    str(tmp_path / "lakehouse"),
                ],
                capture_output=True,
                text=True,
                timeout=400,
                cwd=Path(__file__).parents[2],
            )
            assert done.returncode == 0, done.stderr[-4000:]
            seen = json.loads(done.stdout.strip().splitlines()[-1])
            # the definitions are not held up by the JVM's start: a process of its own starts it
            assert seen["load_seconds"] < 5 and not seen["port_open_after_load"], seen
            assert seen["first_record"] == {"state": "warming", "forms": ["variant"]}, seen
            assert seen["success"]
            said = seen["said"]
            warmed = read_warm_up(port)
            assert warmed is not None and warmed.state == "warmed", warmed
            assert warmed.events == WARM_UP_EVENTS and warmed.seconds is not None and warmed.seconds > 0
            waited = [m for m in said if m.startswith("waiting (at most 120 s) for the Spark server's warm-up")]
            assert waited, said  # the run came while the warm-up went on: it waited for it
            line = f"the Spark server (pid {warmed.server_pid}) was warmed up at {warmed.started_at[11:19]} UTC in "
            assert any(m.startswith(line) and "(variant)" in m for m in said), said
            server_record = read_record(port)
            assert server_record is not None and server_record.detached  # it stays for the runs
            assert server_record.pid == warmed.server_pid
            # the scratch tables are gone; the run's table has its rows
            assert not (Path(server_record.work_dir) / "warm-up").exists()
            assert seen["position"] == len(feed.expected_events(0)) > 0
        finally:
            stop_recorded_server(port)


def _first_record(port: int, within: float):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if (record := read_warm_up(port)) is not None:
            return record
        time.sleep(0.2)
    pytest.fail(f"no warm-up record for port {port} within {within} s")


class _Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.monotonic(), record.getMessage()))


@pytest.fixture
def recorded_server(tmp_path: Path):
    """A server record on a free port naming this (living) process, as a started server's would: what
    the warm-up's record is checked against."""
    port = find_free_port()
    write_record(port, os.getpid(), log_path=tmp_path / "server.log", work_dir=tmp_path, detached=True)
    yield port, read_record(port)
    remove_server_files(port, lock=True)


def _logger() -> tuple[logging.Logger, _Said]:
    said = _Said()
    logger = logging.getLogger(f"test_warm_up.{time.monotonic_ns()}")
    logger.addHandler(said)
    logger.setLevel(logging.INFO)
    return logger, said


def _record(server, **fields) -> dict:
    return {
        "server_pid": server.pid,
        "server_started_at": server.started_at,
        "started_at": "2026-11-28T07:00:00+00:00",
        "events": 60000,
        "forms": ["json"],
        **fields,
    }


def test_a_run_waits_for_the_warm_up_going_on_and_says_when_it_ended(recorded_server) -> None:
    port, server = recorded_server
    path = Path(server.work_dir) / "warm-up.json"
    path.write_text(json.dumps(_record(server, state="warming")))
    lock = open(Path(server.work_dir) / "warm-up.lock", "a")
    fcntl.flock(lock, fcntl.LOCK_EX)  # another process warming: it holds the lock

    def finishing() -> None:
        time.sleep(1.5)
        path.write_text(json.dumps(_record(server, state="warmed", seconds=12.5)))
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()

    threading.Thread(target=finishing).start()
    logger, said = _logger()
    began = time.monotonic()
    log_warm_up(port, logger)
    (waiting, at), (warmed, ended) = [(line, when) for when, line in said.lines]
    assert waiting == "waiting (at most 120 s) for the Spark server's warm-up, started at 07:00:00 UTC, to end"
    assert warmed.startswith(f"the Spark server (pid {server.pid}) was warmed up at 07:00:00 UTC in 12.5 s: ")
    assert ended - began >= 1.4


def test_a_warm_up_whose_process_died_is_not_waited_for_and_a_stale_record_is_not_believed(recorded_server) -> None:
    port, server = recorded_server
    path = Path(server.work_dir) / "warm-up.json"
    path.write_text(json.dumps(_record(server, state="warming")))  # nobody holds the lock: its process died
    logger, said = _logger()
    began = time.monotonic()
    log_warm_up(port, logger)
    assert time.monotonic() - began < 1
    assert said.lines[-1][1] == (
        "the Spark server's warm-up at 07:00:00 UTC failed (its process ended before it finished): this run pays "
        "for the JVM's first loads itself"
    )
    # the record of the server that ran on this port before (another start time): not this server's
    path.write_text(
        json.dumps(_record(server, state="warmed", seconds=3.0, server_started_at="2026-11-27T01:00:00+00:00"))
    )
    logger, said = _logger()
    log_warm_up(port, logger)
    assert said.lines[-1][1].startswith(f"the Spark server on port {port} was not warmed up: the first loads on it pay")


@pytest.mark.parametrize(
    "environment",
    [
        {"DAGSTER_IS_DEV_CLI": "1"},  # any `dg` command: `dg list defs`, `dg launch`
        {"DAGSTER_IS_DEV_CLI": "1", "DAGSTER_verbose": "", "DAGSTER_IS_DEFS_VALIDATION_CLI": "1"},  # dg check defs
        {},  # a deployment's code server
    ],
    ids=["a-dg-command", "dg-check-defs", "no-dagster-dev"],
)
def test_only_dagster_devs_processes_start_and_warm_a_server_when_the_definitions_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, environment: dict[str, str]
) -> None:
    for name in ("DAGSTER_IS_DEV_CLI", "DAGSTER_verbose", "DAGSTER_IS_DEFS_VALIDATION_CLI"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    port = find_free_port()
    project = ProjectConfig(
        lakehouse=str(tmp_path / "lakehouse"),
        spark=SparkSettings(mode="embedded", port=port),
        feeds=[FeedConfig(name="orders", url="http://127.0.0.1:9/feed")],
    )
    assert not warm_up_under_dagster_dev(project.spark_settings(), ["json"])
    build_feedapi_definitions(project)
    assert read_record(port) is None and not port_open(port)
