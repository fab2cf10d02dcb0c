"""The Spark runtime's commands: `feedapi-dagster spark-server` (the embedded Spark Connect server until
Ctrl-C) and `spark status|stop` (the server the runs left running). `feedapi_dagster/cli.py` registers
them; `setup-jars` is `orchestration/setup_command.py`'s (it trains the server's class archive with a
load)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from feedapi_dagster.spark.server_record import ServerRecord


def _configure_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")


def _spark_server(args: argparse.Namespace) -> int:
    from feedapi_dagster.errors import SparkError
    from feedapi_dagster.spark.connect_server import SparkConnectServer

    _configure_logging()
    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = SparkConnectServer(args.port, work_dir=args.work_dir)
    try:
        try:
            server.start()
        except SparkError as exc:  # the server did not start, or the jars are not set up
            print(str(exc), file=sys.stderr)
            return 1
        print(
            f"Spark Connect server listening on {server.url} (pid {server.pid}, log {server.log_path}); Ctrl-C to stop",
            flush=True,
        )
        while not stop.wait(1.0):
            if not server.is_running():
                print(f"Spark Connect server exited with code {server.wait(0)}; see {server.log_path}", file=sys.stderr)
                return 1
        print("Stopping the Spark Connect server ...", flush=True)
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _server_ports(args: argparse.Namespace) -> list[int]:
    """The port given, or those of the servers this installation started (its own port when none)."""
    from feedapi_dagster.spark.server_record import installation_records
    from feedapi_dagster.spark.settings import installation_port

    if args.port is not None:
        return [args.port]
    return [record.port for record in installation_records()] or [installation_port()]


def _spark_status(args: argparse.Namespace) -> int:
    """The embedded servers on the ports, as their records and /proc show them; exit code 1 when none runs."""
    return min(_port_status(port) for port in _server_ports(args))


def _port_status(port: int) -> int:
    from feedapi_dagster.spark.connect_server import port_open
    from feedapi_dagster.spark.server_record import is_recorded_server, read_record
    from feedapi_dagster.spark.settings import installation_port

    record = read_record(port)
    if record is None:
        if port_open(port):
            print(
                f"port {port}: something listens there, but there is no record of an embedded Spark server "
                "started there by this user"
            )
        else:
            print(
                f"no embedded Spark server on port {port}"
                + (" (this installation's port)" if port == installation_port() else "")
            )
        return 1
    if not is_recorded_server(record):
        print(
            f"the embedded Spark server recorded on port {port} (pid {record.pid}) is not running; "
            f"`feedapi-dagster spark stop --port {port}` removes its files"
        )
        return 1
    print("\n".join(_describe_server(record)))
    return 0


def _describe_server(record: ServerRecord) -> list[str]:
    from feedapi_dagster.spark.server_record import process_group, resident_bytes
    from feedapi_dagster.spark.settings import this_installation

    group = process_group(record.pid)
    started = datetime.fromisoformat(record.started_at)
    ours = record.installation == this_installation()
    stop = (
        f"feedapi-dagster spark stop --port {record.port}"
        if ours
        else f"{Path(record.installation) / 'bin' / 'feedapi-dagster'} spark stop --port {record.port}"
    )
    workers = f" and {len(group) - 1} Python workers" if len(group) > 1 else ""
    return [
        f"embedded Spark server on sc://127.0.0.1:{record.port}: running",
        f"  pid           {record.pid}, started {started:%Y-%m-%d %H:%M:%S} UTC ({_age(started)} ago)",
        f"  memory        {_size(resident_bytes(group))} resident (the JVM{workers})",
        f"  log           {record.log_path}",
        f"  installation  {record.installation} ({'this one' if ours else 'not this one: ' + this_installation()})",
        "  lifetime      "
        + (
            "left running for later runs (a JVM takes tens of seconds to start)"
            if record.detached
            else f"stopped when the process that started it (pid {record.owner_pid}) exits"
        ),
        f"  files         {', '.join(str(path) for path in record.files)}, {record.work_dir}/",
        f"stop it with: {stop}",
    ]


def _age(started: datetime) -> str:
    minutes = int((datetime.now(UTC) - started).total_seconds() // 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GB" if count >= 2**30 else f"{count / 2**20:.0f} MB"


def _spark_stop(args: argparse.Namespace) -> int:
    from feedapi_dagster.spark.embedded import ServerNotStopped, stop_recorded_server

    code = 0
    for port in _server_ports(args):
        try:
            print(stop_recorded_server(port))
        except ServerNotStopped as refused:
            print(f"not stopped: {refused}", file=sys.stderr)
            code = 1
    return code


def register(subparsers: argparse._SubParsersAction) -> None:
    from feedapi_dagster.spark.settings import installation_port

    server = subparsers.add_parser(
        "spark-server",
        help="run the embedded Spark Connect server (Delta enabled, 127.0.0.1 only) until Ctrl-C",
    )
    server.add_argument(
        "--port",
        type=int,
        default=installation_port(),
        help=f"port (default {installation_port()}, this installation's)",
    )
    server.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="warehouse/derby/scratch/log dir (default: a temp dir removed at exit)",
    )
    server.set_defaults(func=_spark_server)

    spark = subparsers.add_parser(
        "spark", help="show or stop the embedded Spark Connect server this installation started (it outlives runs)"
    )
    actions = spark.add_subparsers(dest="action", required=True)
    for action, func, text in (
        ("status", _spark_status, "its port, pid, memory, log, start time and installation (exit code 1: none runs)"),
        ("stop", _spark_stop, "stop it and remove its files (only a server this installation started)"),
    ):
        parser = actions.add_parser(action, help=text)
        parser.add_argument(
            "--port",
            type=int,
            default=None,
            help=f"its port (default: those of this installation's servers; its own port is {installation_port()})",
        )
        parser.set_defaults(func=func)
