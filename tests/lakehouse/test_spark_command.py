"""`feedapi-dagster spark status|stop`: the embedded Spark server a run leaves running, as a user
meets it: the run says so, the command shows it, and stops it only for the installation that
started it (another project's virtualenv has its own), never an unrelated process by its pid."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

from feedapi_dagster.lakehouse.connect_server import port_open
from feedapi_dagster.lakehouse.jars import JARS_DIR_ENV, jars_dir
from feedapi_dagster.lakehouse.server_record import process_group, read_record, write_record
from tests.ports import find_free_port
from tests.spark_processes import connect_server_pid

COMMAND = Path(sys.executable).with_name("feedapi-dagster")


def other_installation(root: Path) -> Path:
    """A second virtualenv that has this package (through this one's site-packages): another
    project's installation. Its Python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next((root / "lib").glob("python3*/site-packages"))
    (site / "this_checkout.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return root / "bin" / "python"


def run(command: list[str], temp: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # TMPDIR: the server's token, lock, record and work dir go to this test's folder
    return subprocess.run(
        command, env={**os.environ, "TMPDIR": str(temp), **(env or {})}, capture_output=True, text=True, timeout=300
    )


def test_a_run_says_its_server_stays_and_spark_stop_stops_it_for_its_installation_only(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    other = other_installation(tmp_path / "other-venv")
    port = find_free_port()
    # what a Dagster run of the other project does: start the server on first use, left running
    started = run(
        [
            str(other),
            "-c",
            "from feedapi_dagster.lakehouse.connect_server import ensure_embedded_server; "
            f"ensure_embedded_server({port}, detach=True)",
        ],
        temp,
        {JARS_DIR_ENV: str(jars_dir())},
    )  # this checkout's cache of the jars
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        assert "keeps running after this process exits: a JVM takes tens of seconds to start" in started.stderr
        assert f"`feedapi-dagster spark stop --port {port}` stops it" in started.stderr
        assert port_open(port)  # the process that started it is gone; the server is not
        server_pid = connect_server_pid(port)
        files = [temp / f"feedapi-dagster-spark-{port}.{suffix}" for suffix in ("token", "lock", "json")]
        assert all(path.exists() for path in files)

        status = run([str(COMMAND), "spark", "status", "--port", str(port)], temp)
        assert status.returncode == 0, status.stdout + status.stderr
        installation = str((tmp_path / "other-venv").resolve())
        assert f"embedded Spark server on sc://127.0.0.1:{port}: running" in status.stdout
        assert f"pid           {server_pid}, started " in status.stdout
        assert f"log           {temp / f'feedapi-dagster-spark-{port}' / 'spark-connect-server.log'}" in status.stdout
        assert f"installation  {installation} (not this one: " in status.stdout
        assert re.search(r"\n  memory        (\d+ MB|\d+\.\d GB) resident \(the JVM", status.stdout)

        refused = run([str(COMMAND), "spark", "stop", "--port", str(port)], temp)
        assert refused.returncode == 1
        assert f"was started by the installation {installation}, not this one" in refused.stderr, refused.stderr
        assert port_open(port) and process_group(server_pid)

        stopped = run([str(other), "-m", "feedapi_dagster.cli", "spark", "stop", "--port", str(port)], temp)
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.startswith(f"stopped the embedded Spark server on port {port} (pid {server_pid})")
        assert not port_open(port)
        assert process_group(server_pid) == []  # the JVM and its Python workers
        assert [path for path in files if path.exists()] == []

        gone = run([str(COMMAND), "spark", "status", "--port", str(port)], temp)
        assert (gone.returncode, gone.stdout) == (1, f"no embedded Spark server on port {port}\n")
    finally:
        leftover = connect_server_pid(port)
        if leftover is not None:
            os.killpg(leftover, signal.SIGKILL)


def test_spark_stop_never_signals_a_process_that_has_a_dead_servers_pid(tmp_path: Path, monkeypatch) -> None:
    # a server killed -9 leaves its record; its pid now belongs to another process (of its own group,
    # as the server was: a group signal would reach it)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    port = find_free_port()
    unrelated = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        write_record(port, unrelated.pid, log_path=tmp_path / "server.log", work_dir=tmp_path, detached=True)
        status = run([str(COMMAND), "spark", "status", "--port", str(port)], tmp_path)
        assert status.returncode == 1
        assert f"recorded on port {port} (pid {unrelated.pid}) is not running" in status.stdout
        stopped = run([str(COMMAND), "spark", "stop", "--port", str(port)], tmp_path)
        assert stopped.returncode == 0, stopped.stderr
        assert f"(pid {unrelated.pid}) was not running; removed its files" in stopped.stdout
        assert unrelated.poll() is None
        assert read_record(port) is None
    finally:
        unrelated.kill()
        unrelated.wait()
