"""`feedapi-dagster state TABLE`: a feed table's cursor of record (each partition's cursor, position,
drained) and where it came from. `feedapi_dagster/cli.py` registers it."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from feedapi_dagster.lakehouse.cursor_record import CommittedState


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
    from feedapi_dagster.lakehouse.feed_table import FeedTable
    from feedapi_dagster.spark.failures import first_line
    from feedapi_dagster.spark.sessions import local_spark_session
    from feedapi_dagster.spark.storage import explain_storage_error

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
    state = subparsers.add_parser(
        "state",
        help="show a feed table's cursor of record (each partition's cursor, position, drained) and where it came from",
    )
    state.add_argument("table", help="the feed's Delta table: its folder or URI (<lakehouse>/<feed name>)")
    state.add_argument("--json", action="store_true", help="print it as JSON")
    state.set_defaults(func=_state)
