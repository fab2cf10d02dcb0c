"""The embedded Spark Connect server of this installation: found, reused, started and stopped.

`ensure_embedded_server` reuses a server already listening on the port (`_port_lock` keeps two
processes from starting one at once), so a short-lived process (a Dagster run) only pays for a
client; only a server this installation started (its record: `server_record`), never another
virtualenv's, whose Python workers would run that installation's code. Each installation has a port
of its own by default (`settings.installation_port`). The server process itself is
`connect_server.SparkConnectServer`'s.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal, TypedDict, Unpack

from feedapi_dagster.errors import SparkError
from feedapi_dagster.spark.connect_server import SparkConnectServer, close_clients, port_open
from feedapi_dagster.spark.server_record import (
    is_recorded_server,
    read_record,
    record_file,
    remove_server_files,
    stop_process_group,
)
from feedapi_dagster.spark.settings import LOOPBACK, installation_port, this_installation

log = logging.getLogger(__name__)


class EmbeddedServerOptions(TypedDict, total=False):
    """How an embedded server is started (`SparkConnectServer`'s arguments of the same names)."""

    conf: Mapping[str, str] | None
    work_dir: Path | None
    detach: bool
    startup_timeout: float
    class_archive: Path | Literal["installed"] | None


# the servers this process started, by port (a stopped one is replaced by the next `ensure_embedded_server`)
_started: dict[int, SparkConnectServer] = {}


@contextlib.contextmanager
def _port_lock(port: int) -> Iterator[None]:
    """Serialise server start-up and stop on a port between processes (two Dagster runs starting at
    once; `stop_recorded_server`, which removes the lock file while it holds it)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = Path(tempfile.gettempdir()) / f"feedapi-dagster-spark-{port}.lock"
    while True:
        with open(path, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                # a lock on a file removed meanwhile locks nothing another process can see: open it again
                if path.exists() and os.path.samestat(os.fstat(handle.fileno()), path.stat()):
                    yield
                    return
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def start_embedded_server(port: int, **options: Unpack[EmbeddedServerOptions]) -> SparkConnectServer:
    """Start a Spark Connect server with Delta on 127.0.0.1:<port> (fails if the port is taken)."""
    return SparkConnectServer(port, **options).start()


def ensure_embedded_server(port: int, **options: Unpack[EmbeddedServerOptions]) -> SparkConnectServer:
    """Reuse the server listening on 127.0.0.1:<port>, or start one. What listens there and is not an
    embedded server this installation started is refused (`SparkError`, one line: `_check_reusable`).

    A server started here is stopped when this process exits unless ``detach`` (then it keeps
    running for later processes; its files are in ``<tmp>/feedapi-dagster-spark-<port>``). A reused
    server keeps its own configuration: ``conf`` only applies to a server started here (what differs
    between sessions, the lakehouse's storage settings, is each session's: `sessions.apply_storage`).
    """
    server = _started.get(port)
    if server is not None and server.is_running():
        return server
    if port_open(port):
        return _reuse(port)
    with _port_lock(port):
        if port_open(port):
            return _reuse(port)
        server = start_embedded_server(port, **options)
    if options.get("detach", False):
        log.warning(outlives_message(server))
    else:
        atexit.register(server.stop)
    _started[port] = server
    return server


def _reuse(port: int) -> SparkConnectServer:
    _check_reusable(port)
    log.info("Reusing the Spark Connect server on sc://%s:%d", LOOPBACK, port)
    return SparkConnectServer.attach(port)


def _check_reusable(port: int) -> None:
    """Refuse what listens on `port` unless its record says this installation started it: another
    virtualenv's server runs that installation's Python, packages and jars in its workers."""
    record = read_record(port)
    if record is None:
        raise SparkError(
            f"port {port} is taken by a program that is not an embedded Spark server of this user (no "
            f"{record_file(port)}): set `spark.port` to a free port"
        )
    if record.installation != this_installation():
        own = installation_port()
        advice = "set `spark.port` to a free port" if port == own else f"leave `spark.port` unset (its port is {own})"
        raise SparkError(
            f"the embedded Spark server on port {port} (pid {record.pid}) belongs to another installation, "
            f"{record.installation}, whose Python and packages its workers run; this installation "
            f"({this_installation()}) does not use it: {advice}"
        )


def _spark_command(action: str, port: int) -> str:
    return f"feedapi-dagster spark {action}" + (f" --port {port}" if port != installation_port() else "")


def outlives_message(server: SparkConnectServer) -> str:
    return (
        f"The embedded Spark Connect server on {server.url} (pid {server.pid}, log {server.log_path}) keeps "
        "running after this process exits: a JVM takes tens of seconds to start, so one server serves "
        f"every later run of this installation. `{_spark_command('status', server.port)}` shows it, "
        f"`{_spark_command('stop', server.port)}` stops it."
    )


class ServerNotStopped(SparkError):
    """`stop_recorded_server` refused, or failed, to stop what runs on a port."""


def stop_recorded_server(port: int, timeout: float = 30.0) -> str:
    """Stop the embedded server on `port` that this installation started (SIGTERM to its process
    group, SIGKILL after `timeout`) and remove its token, lock and record files; what was done, for a
    person. Refuses (`ServerNotStopped`) a server another installation started, and anything on the
    port without a record of this user: never a process by a pid alone (`is_recorded_server`)."""
    with _port_lock(port):
        record = read_record(port)
        if record is None:
            if port_open(port):
                raise ServerNotStopped(
                    f"port {port}: something listens there, but there is no record of an "
                    f"embedded Spark server started there by this user ({record_file(port)}); "
                    "not stopping it"
                )
            return f"no embedded Spark server on port {port}: nothing to stop"
        if record.installation != this_installation():
            raise ServerNotStopped(
                f"the embedded Spark server on port {port} (pid {record.pid}) was started by the installation "
                f"{record.installation}, not this one ({this_installation()}): stop it with "
                f"{Path(record.installation) / 'bin' / 'feedapi-dagster'} spark stop --port {port}"
            )
        if not is_recorded_server(record):
            if port_open(port):
                raise ServerNotStopped(
                    f"port {port}: the recorded server (pid {record.pid}) is gone and something "
                    "else listens there; not stopping it"
                )
            remove_server_files(port, lock=True)
            return (
                f"the embedded Spark server recorded on port {port} (pid {record.pid}) was not running; "
                "removed its files"
            )
        close_clients(port)
        # SIGTERM: the JVM shuts down, its Python workers with it
        if not stop_process_group(record.pid, timeout):
            raise ServerNotStopped(f"the Spark server's processes (group {record.pid}) survived SIGKILL")
        remove_server_files(port, lock=True)
    return f"stopped the embedded Spark server on port {port} (pid {record.pid}); its log stays in {record.log_path}"
