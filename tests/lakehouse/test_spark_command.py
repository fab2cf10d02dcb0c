"""`feedapi-dagster spark status|stop`: the embedded Spark server a run leaves running, as a user
meets it: the run says so, the command shows it, and stops it only for the installation that
started it (another project's virtualenv has its own), never an unrelated process by its pid. A run
of one installation never uses the server of another (its Python workers run that one's code)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import sysconfig
import textwrap
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from feedapi_dagster.errors import SparkError
from feedapi_dagster.spark.connect_server import port_open
from feedapi_dagster.spark.embedded import ensure_embedded_server
from feedapi_dagster.spark.jars import JARS_DIR_ENV, jars_dir
from feedapi_dagster.spark.server_record import (
    process_group,
    read_record,
    record_file,
    stop_process_group,
    write_record,
)
from feedapi_dagster.spark.settings import EMBEDDED_PORTS, installation_port
from tests.ports import LOOPBACK, find_free_port
from tests.spark_processes import connect_server_pid

COMMAND = Path(sys.executable).with_name("feedapi-dagster")


@pytest.fixture(scope="module")
def other_installation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second virtualenv that has this package (through this one's site-packages): another
    project's installation, with a Python (`sys.prefix`) of its own, which is what tells installations
    apart; made in ~1 s, where installing the package again would take a minute. Its Python."""
    root = tmp_path_factory.mktemp("other") / "other-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next((root / "lib").glob("python3*/site-packages"))
    (site / "this_checkout.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return root / "bin" / "python"


def run(command: list[str], temp: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # TMPDIR: the server's token, lock, record and work dir go to this test's folder
    return subprocess.run(
        command, env={**os.environ, "TMPDIR": str(temp), **(env or {})}, capture_output=True, text=True, timeout=300
    )


# a run's session on the embedded server at a port (its `spark.port`)
RUN = textwrap.dedent("""
    import sys
    from feedapi_dagster.errors import SparkError
    from feedapi_dagster.spark.sessions import spark_session
    from feedapi_dagster.spark.settings import SparkSettings
    try:
        spark_session(SparkSettings(mode="embedded", port=int(sys.argv[1]))).range(3).collect()
    except SparkError as error:
        print(f"SparkError: {error}")
        sys.exit(3)
    print("used the server")
""")


def test_each_installation_has_a_port_of_its_own(other_installation: Path) -> None:
    code = "from feedapi_dagster.spark.settings import SparkSettings; print(SparkSettings().port)"
    others = subprocess.run([str(other_installation), "-c", code], capture_output=True, text=True, check=True)
    assert installation_port() in EMBEDDED_PORTS and int(others.stdout) in EMBEDDED_PORTS
    assert int(others.stdout) != installation_port()


def test_a_port_another_program_holds_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with socket.create_server((LOOPBACK, 0)) as listener:
        port = listener.getsockname()[1]
        with pytest.raises(SparkError) as refused:
            ensure_embedded_server(port)
    assert str(refused.value) == (
        f"port {port} is taken by a program that is not an embedded Spark server of this user (no "
        f"{tmp_path / f'feedapi-dagster-spark-{port}.json'}): set `spark.port` to a free port"
    )


def test_another_installations_server_on_this_installations_port_is_refused(tmp_path: Path, monkeypatch) -> None:
    # two virtualenv paths whose ports coincide (1 in 900): the port is taken, by a server that is
    # not this installation's; a listening socket and its record stand for it (nothing connects)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with socket.create_server((LOOPBACK, 0)) as listener:
        port = listener.getsockname()[1]
        monkeypatch.setattr("feedapi_dagster.spark.embedded.installation_port", lambda: port)
        record = write_record(port, os.getpid(), log_path=tmp_path / "server.log", work_dir=tmp_path, detached=True)
        record_file(port).write_text(json.dumps(asdict(replace(record, installation="/srv/other-project/.venv"))))
        with pytest.raises(SparkError) as refused:
            ensure_embedded_server(port)
    assert str(refused.value) == (
        f"the embedded Spark server on port {port} (pid {os.getpid()}) belongs to another installation, "
        "/srv/other-project/.venv, whose Python and packages its workers run; this installation "
        f"({Path(sys.prefix).resolve()}) does not use it: set `spark.port` to a free port"
    )


def test_a_run_says_its_server_stays_and_another_installation_neither_uses_nor_stops_it(
    tmp_path: Path, other_installation: Path
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    other = other_installation
    port = find_free_port()
    # what a Dagster run of the other project does: start the server on first use, left running
    started = run(
        [
            str(other),
            "-c",
            "from feedapi_dagster.spark.embedded import ensure_embedded_server; "
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
        installation = str(other.parent.parent.resolve())
        assert f"embedded Spark server on sc://127.0.0.1:{port}: running" in status.stdout
        assert f"pid           {server_pid}, started " in status.stdout
        assert f"log           {temp / f'feedapi-dagster-spark-{port}' / 'spark-connect-server.log'}" in status.stdout
        assert f"installation  {installation} (not this one: " in status.stdout
        assert re.search(r"\n  memory        (\d+ MB|\d+\.\d GB) resident \(the JVM", status.stdout)

        refused = run([str(COMMAND), "spark", "stop", "--port", str(port)], temp)
        assert refused.returncode == 1
        assert f"was started by the installation {installation}, not this one" in refused.stderr, refused.stderr
        assert port_open(port) and process_group(server_pid)

        # a run of this installation whose `spark.port` is that port does not use the other's server
        used = run([sys.executable, "-c", RUN, str(port)], temp)
        assert (used.returncode, used.stdout) == (
            3,
            f"SparkError: the embedded Spark server on port {port} (pid {server_pid}) belongs to another "
            f"installation, {installation}, whose Python and packages its workers run; this installation "
            f"({Path(sys.prefix).resolve()}) does not use it: leave `spark.port` unset (its port is "
            f"{installation_port()})\n",
        ), used.stdout + used.stderr[-3000:]
        assert "Reusing the Spark Connect server" not in used.stderr

        # without --port, each installation's commands find its own server, and only its own
        ours = run([str(COMMAND), "spark", "status"], temp)
        assert (ours.returncode, ours.stdout) == (
            1,
            f"no embedded Spark server on port {installation_port()} (this installation's port)\n",
        )
        theirs = run([str(other), "-m", "feedapi_dagster.cli", "spark", "status"], temp)
        assert theirs.returncode == 0, theirs.stdout + theirs.stderr
        assert f"embedded Spark server on sc://127.0.0.1:{port}: running" in theirs.stdout
        assert f"installation  {installation} (this one)" in theirs.stdout

        stopped = run([str(other), "-m", "feedapi_dagster.cli", "spark", "stop"], temp)
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


IGNORES_SIGTERM = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the child it starts
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("ready", flush=True)
time.sleep(60)
"""


def test_stop_process_group_kills_what_ignores_sigterm_and_waits_for_every_member() -> None:
    # a leader and its child (the JVM and a Python worker) that both ignore SIGTERM: killed after the
    # grace period, the caller told first; then a group that obeys SIGTERM stops without a SIGKILL
    stubborn = subprocess.Popen(
        [sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    obedient = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == "ready\n"
        assert len(process_group(stubborn.pid)) == 2
        killing: list[int] = []
        assert stop_process_group(stubborn.pid, 1.0, on_kill=lambda: killing.append(stubborn.pid))
        assert killing == [stubborn.pid]
        assert process_group(stubborn.pid) == []
        assert stubborn.wait(5) == -signal.SIGKILL

        assert stop_process_group(obedient.pid, 30.0, on_kill=lambda: killing.append(obedient.pid))
        assert killing == [stubborn.pid]
        assert obedient.wait(5) == -signal.SIGTERM
    finally:
        for process in (stubborn, obedient):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
