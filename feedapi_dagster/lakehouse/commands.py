"""The lakehouse's commands: `feedapi-dagster setup-jars` (the Delta and s3a jars), `spark-server`
(the embedded Spark Connect server until Ctrl-C), `spark status|stop` (the server the runs left running)
and `state` (a feed table's cursor of record). `feedapi_dagster/cli.py` registers them."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from feedapi_dagster.lakehouse.cursor_record import CommittedState
    from feedapi_dagster.lakehouse.server_record import ServerRecord


def _configure_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")


def _setup_jars(args: argparse.Namespace) -> int:
    from feedapi_dagster.lakehouse.jars import DeltaJarsError, jars_dir, setup_delta_jars

    _configure_logging()
    try:
        jars = setup_delta_jars(force=args.force, resolver=args.resolver)
    except DeltaJarsError as exc:
        print(f"setup-jars failed: {exc}", file=sys.stderr)
        return 1
    print(f"{len(jars)} jars (Delta, s3a) in {jars_dir()}")
    return 0


def _spark_server(args: argparse.Namespace) -> int:
    from feedapi_dagster.errors import SparkError
    from feedapi_dagster.lakehouse.connect_server import SparkConnectServer

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
    from feedapi_dagster.lakehouse.server_record import installation_records
    from feedapi_dagster.lakehouse.spark_conf import installation_port

    if args.port is not None:
        return [args.port]
    return [record.port for record in installation_records()] or [installation_port()]


def _spark_status(args: argparse.Namespace) -> int:
    """The embedded servers on the ports, as their records and /proc show them; exit code 1 when none runs."""
    return min(_port_status(port) for port in _server_ports(args))


def _port_status(port: int) -> int:
    from feedapi_dagster.lakehouse.connect_server import port_open
    from feedapi_dagster.lakehouse.server_record import is_recorded_server, read_record
    from feedapi_dagster.lakehouse.spark_conf import installation_port

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
    from feedapi_dagster.lakehouse.server_record import process_group, resident_bytes
    from feedapi_dagster.lakehouse.spark_conf import this_installation

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
    from feedapi_dagster.lakehouse.connect_server import ServerNotStopped, stop_recorded_server

    code = 0
    for port in _server_ports(args):
        try:
            print(stop_recorded_server(port))
        except ServerNotStopped as refused:
            print(f"not stopped: {refused}", file=sys.stderr)
            code = 1
    return code


def _state(args: argparse.Namespace) -> int:
    """The cursor of record of a feed table and where it came from: delta-rs where it can read the
    table and the state is in a commit; a local Spark session where the state must be recovered from
    the rows (or delta-rs cannot open the table)."""
    from feedapi_dagster.errors import StateError

    try:
        committed = _committed_state(args.table)
    except StateError as error:
        print(f"{args.table}: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(
            json.dumps(
                {
                    "table": args.table,
                    "source": committed.source,
                    "delta_version": committed.delta_version,
                    "table_version": committed.table_version,
                    "load_id": committed.load_id,
                    **committed.state.model_dump(mode="json"),
                },
                indent=2,
            )
        )
        return 0
    print(f"{args.table}\ncursor of record: {committed.describe()}")
    print(f"{'partition':>9}  {'position':>10}  {'drained':7}  cursor")
    for partition_id, partition in sorted(committed.state.partitions.items()):
        inherited = f" (inherited from {partition.inherited_from})" if partition.inherited_from is not None else ""
        print(
            f"{partition_id:>9}  {partition.position:>10}  {'yes' if partition.drained else 'no':7}  "
            f"{partition.cursor}{inherited}"
        )
    return 0


def _committed_state(table: str) -> CommittedState:
    """The table's cursor of record; `StateError` (one line) when there is no table to read it from."""
    from deltalake.exceptions import TableNotFoundError

    from feedapi_dagster.errors import StateError
    from feedapi_dagster.lakehouse.cursor_record import RecoveryNeedsSpark, read_committed_state

    no_table = "no Delta table here (no _delta_log with commits under it)"
    local = _local_path(table)
    if local is not None and not (local / "_delta_log").is_dir():
        # before delta-rs, whose message is about its internals, and before Spark, which takes seconds to start
        raise StateError(no_table if local.exists() else "no such folder")
    try:
        return read_committed_state(table)
    except RecoveryNeedsSpark:
        return _read_with_spark(table)
    except TableNotFoundError:  # delta-rs's message is about its log segments
        raise StateError(no_table) from None
    except StateError:
        raise
    except Exception:  # noqa: BLE001 - delta-rs cannot open it (v2 checkpoints, storage it lacks)
        return _read_with_spark(table)


def _local_path(table: str) -> Path | None:
    if table.startswith("file://"):
        return Path(table.removeprefix("file://"))
    return None if "://" in table else Path(table)


def _read_with_spark(table: str) -> CommittedState:
    import tempfile

    from feedapi_dagster.errors import StateError
    from feedapi_dagster.lakehouse.cursor_record import read_committed_state
    from feedapi_dagster.lakehouse.delta import FeedTable
    from feedapi_dagster.lakehouse.sessions import local_spark_session
    from feedapi_dagster.lakehouse.spark_errors import first_line
    from feedapi_dagster.lakehouse.storage import explain_storage_error

    spark_log = Path(tempfile.gettempdir()) / "feedapi-dagster-state-spark.log"
    with tempfile.TemporaryDirectory(prefix="feedapi-dagster-state-") as work_dir, _stderr_to(spark_log):
        spark = local_spark_session(work_dir=Path(work_dir))
        try:
            return read_committed_state(FeedTable(spark, table))
        except StateError:
            raise
        except Exception as error:  # noqa: BLE001 - Spark's errors quote its stack: a person reads one line
            explained = explain_storage_error(table, error)
            reason = str(explained) if explained is not None else first_line(error, limit=1000)
            raise StateError(f"Spark cannot read it: {reason} (Spark's log: {spark_log})") from None
        finally:
            spark.stop()


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """This process's stderr into `path`: the JVM Spark starts inherits it and writes its warnings and
    stack traces there, not into the one line the command prints."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "wb") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def register(subparsers: argparse._SubParsersAction) -> None:
    from feedapi_dagster.lakehouse.spark_conf import installation_port

    setup = subparsers.add_parser(
        "setup-jars",
        help="resolve the Delta Lake jars once into the local cache (the only step that needs Maven)",
    )
    setup.add_argument("--force", action="store_true", help="resolve again even if the cache is complete")
    setup.add_argument(
        "--resolver",
        choices=("auto", "ivy", "maven"),
        default="auto",
        help="Spark's Ivy resolver, mvn, or Ivy then mvn (default)",
    )
    setup.set_defaults(func=_setup_jars)

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

    state = subparsers.add_parser(
        "state",
        help="show a feed table's cursor of record (each partition's cursor, position, drained) and where it came from",
    )
    state.add_argument("table", help="the feed's Delta table: its folder or URI (<lakehouse>/<feed name>)")
    state.add_argument("--json", action="store_true", help="print it as JSON")
    state.set_defaults(func=_state)
