"""`feedapi-dagster setup-jars` and `feedapi-dagster spark-server`."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path


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
    from feedapi_dagster.lakehouse.jars import DeltaJarsNotSetUp
    from feedapi_dagster.lakehouse.connect_server import SparkConnectServer
    from feedapi_dagster.lakehouse.spark_conf import SparkStartupError

    _configure_logging()
    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = SparkConnectServer(args.port, work_dir=args.work_dir)
    try:
        try:
            server.start()
        except (SparkStartupError, DeltaJarsNotSetUp) as exc:
            print(str(exc), file=sys.stderr)
            return 1
        print(f"Spark Connect server listening on {server.url} (pid {server.pid}, log {server.log_path}); "
              "Ctrl-C to stop", flush=True)
        while not stop.wait(1.0):
            if not server.is_running():
                print(f"Spark Connect server exited with code {server.wait(0)}; see {server.log_path}",
                      file=sys.stderr)
                return 1
        print("Stopping the Spark Connect server ...", flush=True)
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _state(args: argparse.Namespace) -> int:
    """The cursor of record of a feed table and where it came from: delta-rs where it can read the
    table and the state is in a commit; a local Spark session where the state must be recovered from
    the rows (or delta-rs cannot open the table)."""
    from feedapi_dagster.lakehouse.state import RecoveryNeedsSpark, StateError, read_committed_state

    try:
        try:
            committed = read_committed_state(args.table)
        except StateError as error:
            if not isinstance(error, RecoveryNeedsSpark):
                raise
            committed = _read_with_spark(args.table)
        except Exception:  # noqa: BLE001 - delta-rs cannot open it (v2 checkpoints, storage it lacks)
            committed = _read_with_spark(args.table)
    except StateError as error:
        print(f"{args.table}: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"table": args.table, "source": committed.source, "delta_version": committed.delta_version,
                          "table_version": committed.table_version, "load_id": committed.load_id,
                          **committed.state.model_dump(mode="json")}, indent=2))
        return 0
    print(f"{args.table}\ncursor of record: {committed.describe()}")
    print(f"{'partition':>9}  {'position':>10}  {'drained':7}  cursor")
    for partition_id, partition in sorted(committed.state.partitions.items()):
        inherited = f" (inherited from {partition.inherited_from})" if partition.inherited_from is not None else ""
        print(f"{partition_id:>9}  {partition.position:>10}  {'yes' if partition.drained else 'no':7}  "
              f"{partition.cursor}{inherited}")
    return 0


def _read_with_spark(table: str):
    import tempfile

    from feedapi_dagster.lakehouse.delta import FeedTable
    from feedapi_dagster.lakehouse.sessions import local_spark_session
    from feedapi_dagster.lakehouse.state import read_committed_state

    with tempfile.TemporaryDirectory(prefix="feedapi-dagster-state-") as work_dir:
        spark = local_spark_session(work_dir=Path(work_dir))
        try:
            return read_committed_state(FeedTable(spark, table))
        finally:
            spark.stop()


def register(subparsers: argparse._SubParsersAction) -> None:
    from feedapi_dagster.lakehouse.spark_conf import DEFAULT_PORT

    setup = subparsers.add_parser(
        "setup-jars",
        help="resolve the Delta Lake jars once into the local cache (the only step that needs Maven)",
    )
    setup.add_argument("--force", action="store_true", help="resolve again even if the cache is complete")
    setup.add_argument("--resolver", choices=("auto", "ivy", "maven"), default="auto",
                       help="Spark's Ivy resolver, mvn, or Ivy then mvn (default)")
    setup.set_defaults(func=_setup_jars)

    server = subparsers.add_parser(
        "spark-server",
        help="run the embedded Spark Connect server (Delta enabled, 127.0.0.1 only) until Ctrl-C",
    )
    server.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    server.add_argument("--work-dir", type=Path, default=None,
                        help="warehouse/derby/scratch/log dir (default: a temp dir removed at exit)")
    server.set_defaults(func=_spark_server)

    state = subparsers.add_parser(
        "state",
        help="show a feed table's cursor of record (each partition's cursor, position, drained) and where it came from",
    )
    state.add_argument("table", help="the feed's Delta table: its folder or URI (<lakehouse>/<feed name>)")
    state.add_argument("--json", action="store_true", help="print it as JSON")
    state.set_defaults(func=_state)
