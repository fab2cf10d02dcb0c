"""`feedapi-dagster dev` from an empty directory: the demo feed, Spark and `dagster dev` come up, the
daemon's sensor loads the feed in a run of its own, and a SIGTERM (a supervisor's stop) leaves no
process and no port behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from feedapi_dagster.spark.connect_server import port_open
from tests.ports import find_free_port

START_TIMEOUT = 300.0
MATERIALIZED = """{ assetOrError(assetKey: {path: ["feedapi", "demo"]}) {
  __typename ... on Asset { assetMaterializations(limit: 10) { partition runId } } } }"""


def _graphql(port: int, query: str) -> dict | None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)["data"]
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def _processes_in(folder: Path) -> dict[int, str]:
    """The processes whose working directory is in `folder`: their command lines."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if Path(os.readlink(entry / "cwd")).is_relative_to(folder):
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        except OSError:  # gone, or not ours to read
            continue
    return found


def _ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(find_free_port())
    return sorted(ports)


@pytest.mark.spark
@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="finds processes through /proc")
def test_dev_serves_the_demo_loads_it_and_stops_everything_on_sigterm(tmp_path: Path) -> None:
    workdir = tmp_path / "empty"
    workdir.mkdir()
    feed_port, spark_port, web_port = _ports(3)
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "SPARK_REMOTE")}
    env["TMPDIR"] = str(tmp_path)  # the Spark server's files, and a place to look for what is left running
    command = [
        str(Path(sys.executable).with_name("feedapi-dagster")),
        "dev",
        "--events",
        "200",
        "--partitions",
        "2",
        "--feed-port",
        str(feed_port),
        "--spark-port",
        str(spark_port),
        "--",
        "--port",
        str(web_port),
    ]
    log = (tmp_path / "dev.log").open("wb")
    dev = subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        materialized: list[dict] = []
        while time.monotonic() < deadline and dev.poll() is None:
            data = _graphql(web_port, MATERIALIZED)
            asset = (data or {}).get("assetOrError") or {}
            materialized = asset.get("assetMaterializations") or []
            if {m["partition"] for m in materialized} >= {"0", "1"}:
                break
            time.sleep(2)
        assert dev.poll() is None, f"`feedapi-dagster dev` ended early:\n{_tail(tmp_path / 'dev.log')}"
        assert {m["partition"] for m in materialized} >= {"0", "1"}, (
            f"the daemon's runs did not materialize both partitions of feedapi/demo in {START_TIMEOUT:.0f} s: "
            f"{materialized}\n{_tail(tmp_path / 'dev.log')}"
        )
        assert (workdir / "lakehouse" / "demo" / "_delta_log").is_dir()
        assert (workdir / ".dagster_home" / "dagster.yaml").is_file()
        # the Spark server was warmed while `dagster dev` started, and the runs' logs say so
        said = (tmp_path / "dev.log").read_text(errors="replace")
        assert "warming the Spark server up (60,000 events of a scratch feed into a scratch table)" in said, _tail(
            tmp_path / "dev.log"
        )
        assert re.search(r"the Spark server \(pid \d+\) was warmed up at [\d:]+ UTC in [\d.]+ s", said), _tail(
            tmp_path / "dev.log"
        )

        dev.send_signal(signal.SIGTERM)
        code = dev.wait(90)
        # children that got their SIGTERM may take a moment to exit; a code server whose webserver or
        # daemon is gone stops at its heartbeat timeout (45 s, `dagster dev`'s): once seen still up
        # after 30 s on a loaded machine
        deadline = time.monotonic() + 60
        while (left := _processes_in(tmp_path)) and time.monotonic() < deadline:
            time.sleep(1)
        assert not left, f"processes left running after SIGTERM (exit code {code}): {left}"
        listening = [port for port in (feed_port, spark_port, web_port) if port_open(port)]
        assert not listening, f"ports still listening after SIGTERM: {listening}"
    finally:
        if dev.poll() is None:
            os.killpg(dev.pid, signal.SIGKILL)
        for pid in _processes_in(tmp_path):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


def _tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
