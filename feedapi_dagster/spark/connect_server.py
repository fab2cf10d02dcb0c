"""The Spark Connect server process: a child JVM (``spark-submit --class ...SparkConnectServer``)
started from the pip-installed pyspark with the cached Delta jars (`settings.build_conf`), bound to
127.0.0.1 only; finding, reusing and stopping the embedded one is `embedded`'s.

The server runs Python for whoever reaches its port, so it requires Spark Connect's authentication
token: one per server start, in the server's environment (not its command line), and handed to its
clients through a file only this user can read (`token_file`). A server this process stops closes
this process's Connect clients of it first (`register_client`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from feedapi_dagster.errors import SparkError
from feedapi_dagster.spark.class_archive import archive_path, class_path, sharing_options
from feedapi_dagster.spark.jar_resolution import log_tail, pyspark_home
from feedapi_dagster.spark.jars import delta_jars
from feedapi_dagster.spark.server_record import read_record, remove_server_files, stop_process_group, write_record
from feedapi_dagster.spark.settings import (
    CONNECT_SERVER_CLASS,
    FULL_JIT_JAVA_OPTION,
    LOCAL_MASTER,
    LOOPBACK,
    build_conf,
)

log = logging.getLogger(__name__)


# The work of a client gone (a run killed mid-load: its Spark job, its read tasks' Python workers
# still fetching pages) is interrupted once its RPC has been detached for `detachedTimeout`, looked for
# every `maintenanceInterval`. The server sees a silent RPC as detached only when it ends it itself, at
# `senderMaxStreamDuration` (a live client then reattaches at once). Spark's defaults: 2 minutes, 5
# minutes and 30 s, up to 7.5 minutes of a dead client's work; these: at most 70 s.
DEAD_CLIENT_CONF = {
    "spark.connect.execute.reattachable.senderMaxStreamDuration": "30s",
    "spark.connect.execute.manager.detachedTimeout": "30s",
    "spark.connect.execute.manager.maintenanceInterval": "10s",
}


def port_open(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


_SESSION_NAMESPACE = uuid.UUID("0b0e7d2c-6f5e-4f43-9a43-8f3c1b7e2a51")


def token_file(port: int) -> Path:
    """Where the embedded server on `port` keeps its authentication token (mode 0600)."""
    return Path(tempfile.gettempdir()) / f"feedapi-dagster-spark-{port}.token"


def _write_token(port: int) -> str:
    token = secrets.token_urlsafe(32)
    path = token_file(port)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token)
    return token


def read_token(port: int) -> str:
    """The token of the embedded server on `port`; refuses a file someone else could have written or read."""
    path = token_file(port)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise SparkError(
            f"a Spark Connect server listens on port {port}, but {path} (its token) is "
            "missing: it was not started by feedapi-dagster as this user"
        ) from None
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise SparkError(f"{path} must belong to this user with mode 0600; not using it")
    return path.read_text().strip()


# Connect clients of this process, by their server's port: a server this process stops closes its
# clients first, or their exit hook would wait up to 10 minutes (pyspark's retry policy) for it.
_clients: list[tuple[int | None, Any]] = []


def register_client(port: int | None, session: Any) -> None:
    """Note a Connect session of this process whose server listens on `port` (`sessions.connect_session`)."""
    _clients.append((port, session))


def close_clients(port: int) -> None:
    """Close this process's Connect clients of the server on `port` (it is about to stop)."""
    for entry in list(_clients):
        if entry[0] == port:
            with contextlib.suppress(Exception):
                entry[1].client.close()
            _clients.remove(entry)


class SparkConnectServer:
    """A Spark Connect server in a child JVM (``spark-submit --class SparkConnectServer``).

    ``SparkConnectServer(port).start()`` or ``with SparkConnectServer(port) as server: ...``;
    ``server.url`` is ``sc://127.0.0.1:<port>``. `attach` makes a handle for a server someone else
    runs (``stop()`` then does nothing). ``env``: variables added to the server's environment (the
    server as a cluster's driver with an environment of its own; the lakehouse's credentials come with
    each session instead).
    """

    def __init__(
        self,
        port: int,
        *,
        conf: Mapping[str, str] | None = None,
        work_dir: Path | None = None,
        jars: Sequence[Path] | None = None,
        java_options: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 180.0,
        detach: bool = False,
        class_archive: Path | Literal["installed"] | None = "installed",
    ) -> None:
        self.port = port
        self.host = LOOPBACK
        self.startup_timeout = startup_timeout
        self.detach = detach
        self._conf = dict(conf or {})
        self._jars = jars
        self._java_options = list(java_options)
        # "installed": the archive `setup-jars` made, where it did; None: none (a training server's, a benchmark's)
        self._class_archive = class_archive
        self._mapped_archive: Path | None = None  # the archive the started server maps
        self._env = dict(env or {})
        self._work_dir = Path(work_dir).resolve() if work_dir is not None else None
        self._remove_work_dir = False
        self._proc: subprocess.Popen | None = None
        self._log_file: Any = None
        self._owned = True
        self.log_path: Path | None = None

    # -- handles ----------------------------------------------------------------------------

    @classmethod
    def attach(cls, port: int) -> SparkConnectServer:
        """A handle for a server already listening on 127.0.0.1:<port> that this process does not own."""
        server = cls(port)
        server._owned = False
        return server

    @property
    def url(self) -> str:
        """For display: the server's address, without its token."""
        return f"sc://{self.host}:{self.port}"

    def client_url(self) -> str:
        """The Spark Connect URL a client connects with: the token goes over a local channel (gRPC's
        local credentials, which pyspark uses for `localhost` with a token). Every client of this
        server joins one server-side session: a session has Python workers of its own, and a new one
        per run would start and import them again in every run (a read takes twice as long to stage
        in a new session: `benchmarks/README.md`)."""
        token = read_token(self.port)
        return f"sc://localhost:{self.port}/;token={token};session_id={uuid.uuid5(_SESSION_NAMESPACE, token)}"

    @property
    def owned(self) -> bool:
        return self._owned

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def work_dir(self) -> Path | None:
        return self._work_dir

    def is_running(self) -> bool:
        if not self._owned:
            return port_open(self.port, self.host)
        return self._proc is not None and self._proc.poll() is None

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"<SparkConnectServer {self.url} {state} pid={self.pid} owned={self._owned}>"

    def __enter__(self) -> SparkConnectServer:
        if self._owned and self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- life cycle -------------------------------------------------------------------------

    def _prepared_work_dir(self) -> Path:
        if self._work_dir is None:
            raise SparkError("work dir not prepared")
        return self._work_dir

    def command(self) -> list[str]:
        """The spark-submit command line (configuration included)."""
        jars = delta_jars() if self._jars is None else list(self._jars)
        archive = archive_path() if self._class_archive == "installed" else self._class_archive
        self._mapped_archive = archive if sharing_options(archive) else None
        # The server lives long and does the loads' heavy lifting (JSON functions, Parquet encoding),
        # where C1-only code is slow (the benchmark's JVM time per commit): full JIT (C2) back.
        conf = build_conf(
            self._prepared_work_dir(),
            self._conf,
            jars=jars,
            java_options=(FULL_JIT_JAVA_OPTION, *sharing_options(self._mapped_archive), *self._java_options),
        )
        # the Delta jars on the JVM's class path too: the class archive holds only the class path's
        # classes (`class_archive.py`), and a class is found there first; `spark.jars` stays for a
        # cluster's executors (`spark.master` in `conf`), which get them from it
        own_path = self._conf.get("spark.driver.extraClassPath")
        conf["spark.driver.extraClassPath"] = os.pathsep.join(p for p in (class_path(jars), own_path) if p)
        conf.update(
            {
                "spark.connect.grpc.binding.address": self.host,
                "spark.connect.grpc.binding.port": str(self.port),
                # fail instead of silently moving to port+1 when the port is taken
                "spark.connect.grpc.port.maxRetries": "0",
                **{key: value for key, value in DEAD_CLIENT_CONF.items() if key not in (self._conf or {})},
            }
        )
        cmd = [
            str(pyspark_home() / "bin" / "spark-submit"),
            "--master",
            conf.pop("spark.master", LOCAL_MASTER),
            "--name",
            conf.pop("spark.app.name", "feedapi-dagster-connect"),
            "--class",
            CONNECT_SERVER_CLASS,
        ]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        cmd.append("spark-internal")
        return cmd

    def _child_env(self) -> dict[str, str]:
        home = pyspark_home()
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "PYSPARK_SUBMIT_ARGS")
        }
        env.update(
            SPARK_HOME=str(home),
            SPARK_LOCAL_IP=LOOPBACK,
            SPARK_LOCAL_DIRS=str(self._prepared_work_dir() / "tmp"),
            # Python UDFs sent by clients run in workers of this interpreter (same version as the client)
            PYSPARK_PYTHON=sys.executable,
        )
        env.update(self._env)
        return env

    def start(self) -> SparkConnectServer:
        if not self._owned:
            raise SparkError(f"{self.url} is not owned by this handle")
        if self.is_running():
            return self
        if port_open(self.port, self.host):
            raise SparkError(f"cannot start a Spark Connect server: port {self.port} is already in use")
        if self._work_dir is None:
            if self.detach:
                self._work_dir = Path(tempfile.gettempdir()) / f"feedapi-dagster-spark-{self.port}"
            else:
                self._work_dir = Path(tempfile.mkdtemp(prefix=f"feedapi-dagster-spark-{self.port}-"))
                self._remove_work_dir = True
        self._work_dir.mkdir(parents=True, exist_ok=True)
        # in the server's environment, not its command line (which `ps` shows to every user)
        self._env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = _write_token(self.port)
        cmd = self.command()
        self.log_path = self._work_dir / "spark-connect-server.log"
        self._log_file = open(self.log_path, "ab")
        log.info("Starting Spark Connect server on %s (log: %s)", self.url, self.log_path)
        started = time.monotonic()
        self._proc = subprocess.Popen(
            cmd,
            cwd=self._work_dir,
            env=self._child_env(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() reaches every child, Ctrl-C does not
        )
        write_record(self.port, self._proc.pid, log_path=self.log_path, work_dir=self._work_dir, detached=self.detach)
        try:
            self._wait_ready()
        except BaseException as exc:
            tail = log_tail(self.log_path, 40) if self.log_path is not None else "(no log)"
            self.stop()
            if not isinstance(exc, SparkError):
                raise
            raise SparkError(
                f"Spark Connect server on {self.url} did not start ({exc}); last log lines:\n{tail}"
            ) from None
        log.info(
            "Spark Connect server ready on %s after %.1f s (pid %s; %s)",
            self.url,
            time.monotonic() - started,
            self.pid,
            f"classes mapped from {self._mapped_archive}"
            if self._mapped_archive is not None
            else "no class archive: `feedapi-dagster setup-jars` makes one",
        )
        return self

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise SparkError(f"server exited with code {code}")
            if port_open(self.port, self.host, timeout=0.25):
                return
            time.sleep(0.2)
        raise SparkError(f"server not listening after {self.startup_timeout:.0f} s")

    def stop(self, timeout: float = 30.0) -> None:
        """Terminate (SIGTERM to the process group: the JVM and its Python workers), kill what is left
        after ``timeout``; idempotent."""
        if not self._owned or self._proc is None:
            return
        close_clients(self.port)
        proc = self._proc

        def killing() -> None:
            log.warning("Spark Connect server pid %s ignored SIGTERM for %.0f s; killing it", proc.pid, timeout)

        if not stop_process_group(proc.pid, timeout, on_kill=killing):
            log.warning("Spark Connect server pid %s: processes of its group survived SIGKILL", proc.pid)
        proc.poll()  # reaps the exited JVM
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._remove_work_dir and self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
        record = read_record(self.port)
        if record is None or record.pid == proc.pid:  # not those of a server started since (`spark stop`)
            remove_server_files(self.port, lock=False)  # the lock is `embedded._port_lock`'s

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the server process to exit; its exit code (None if still running after timeout)."""
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
