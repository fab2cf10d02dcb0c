"""A project's feed tables under their feeds' names in a Spark session, for SQL written the way the
docs write it: `SELECT ... FROM orders`, and ``delta.`lakehouse/orders` `` relative to the project's
folder (as its `lakehouse` setting is) for what takes a table and not a view (OPTIMIZE, RESTORE,
DESCRIBE HISTORY).

Why both: a session's temporary view is the one name Spark gives a table for that session alone (a
catalog table would be every session's of a shared server, and several projects share one), and
Delta refuses a view where it needs the table itself. Why a path is rewritten at all: a Spark server
resolves a relative path against its own working folder, not the client's (the embedded server's is
a folder of its own), so ``delta.`lakehouse/orders` `` names no table there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# `delta.` then a backquoted path with no scheme (`s3a://`, `file:`) that does not start at the root
_RELATIVE_DELTA_PATH = re.compile(r"(?i)(delta\.)`(?![A-Za-z][A-Za-z0-9+.-]*:|/)((?:[^`]|``)+)`")


def register_feed_views(spark: SparkSession, tables: Mapping[str, str]) -> list[str]:
    """Each feed's table (`tables`: feed name -> table URI) as a temporary view of `spark` by the feed's
    name; the names of the feeds that have no table yet (nothing loaded), which get none."""
    from pyspark.errors import AnalysisException

    without_table = []
    for name, uri in tables.items():
        try:
            spark.read.format("delta").load(uri).createOrReplaceTempView(name)
        except AnalysisException as error:
            if error.getCondition() not in ("DELTA_PATH_DOES_NOT_EXIST", "DELTA_MISSING_DELTA_TABLE", "PATH_NOT_FOUND"):
                raise
            without_table.append(name)
    return without_table


def with_project_paths(statement: str, root: Path) -> str:
    """`statement` with each relative ``delta.`path` `` made absolute against the project's folder `root`."""

    def absolute(match: re.Match[str]) -> str:
        path = match.group(2).replace("``", "`")
        return match.group(1) + "`" + str((root / path).resolve()).replace("`", "``") + "`"

    return _RELATIVE_DELTA_PATH.sub(absolute, statement)
