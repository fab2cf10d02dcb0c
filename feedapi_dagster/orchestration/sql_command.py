"""`feedapi-dagster sql "SELECT ..."`: SQL on a dg project's feed tables, by their feeds' names, printed
as a table; `sql_session()`, the same Spark session for a notebook.

Run in the project's folder: its definitions are loaded as `dg` loads them, the session is the one its
loads use (the embedded Spark server, started if it is not running; a cluster's; its lakehouse's S3
settings), and each feed's table is a view by the feed's name (`lakehouse.feed_views`).

    feedapi-dagster sql "SELECT partition_id, count(*) AS events FROM orders GROUP BY 1 ORDER BY 1"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from feedapi_dagster.errors import FeedApiDagsterError
from feedapi_dagster.lakehouse.feed_views import register_feed_views, with_project_paths
from feedapi_dagster.spark.watchdog import answering

from .loads import RESOURCE_KEY, TABLE_METADATA_PREFIX
from .project_definitions import load_project_definitions

if TYPE_CHECKING:
    import dagster as dg
    from pyspark.sql import DataFrame, SparkSession


def register(subparsers: Any) -> None:
    command = subparsers.add_parser(
        "sql",
        help="run Spark SQL on the dg project's feed tables, named by their feeds (run in the project's folder)",
        description=__doc__.splitlines()[0],
    )
    command.add_argument("statement", help='one Spark SQL statement, e.g. "SELECT * FROM orders LIMIT 5"')
    command.add_argument("--limit", type=int, default=20, help="rows printed at most (default 20)")
    command.add_argument(
        "--truncate", type=int, default=60, help="characters of a value printed at most (0: whole; default 60)"
    )
    command.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    root = Path.cwd()
    try:
        spark, tables = _session_of(load_project_definitions(root))
        # a server that stops answering ends the command with `SparkUnresponsive`, as it ends a run
        with answering(spark, "the SQL statement"):
            without_table = register_feed_views(spark, tables)
            if without_table:
                print(f"no table yet (nothing loaded) for: {', '.join(without_table)}", file=sys.stderr)
            feed_sql(spark, args.statement, root).show(n=args.limit, truncate=args.truncate or False)
    except FeedApiDagsterError as error:
        print(error, file=sys.stderr)
        return 1
    except Exception as error:  # noqa: BLE001 - Spark's analysis and parse errors: their first line is the message
        print(str(error).strip().splitlines()[0], file=sys.stderr)
        return 1
    return 0


def feed_sql(spark: SparkSession, statement: str, root: Path) -> DataFrame:
    """`statement` (one, a trailing `;` allowed) run by `spark`, a relative ``delta.`path` `` in it taken
    as relative to the project's folder `root`."""
    return spark.sql(with_project_paths(statement.strip().removesuffix(";"), root))


def sql_session(project: str | Path = ".") -> SparkSession:
    """The Spark session of the dg project at `project` (its loads' session), each feed's table a view by
    the feed's name: `spark = sql_session(); spark.sql("SELECT * FROM orders").show()`."""
    spark, tables = _session_of(load_project_definitions(Path(project).resolve()))
    register_feed_views(spark, tables)
    return spark


class _NoFeeds(FeedApiDagsterError):
    """A project whose definitions have no feed."""


def _session_of(defs: dg.Definitions) -> tuple[SparkSession, dict[str, str]]:
    tables = {
        key.removeprefix(TABLE_METADATA_PREFIX): str(getattr(value, "value", value))
        for key, value in (defs.metadata or {}).items()
        if key.startswith(TABLE_METADATA_PREFIX)
    }
    resource = (defs.resources or {}).get(RESOURCE_KEY)
    if not tables or resource is None:
        raise _NoFeeds("no feed in this dg project (no FeedApiComponent or build_feedapi_definitions in its defs)")
    return resource.spark_session, tables
