"""feedapi-dagster: FeedAPI event feeds into Delta Lake, read and written by Spark, orchestrated by Dagster.

`FeedDataSource` is the PySpark data source `feedapi` (usable without Dagster); `FeedApiComponent` is
the Dagster Component (`type: feedapi_dagster.FeedApiComponent` in a defs.yaml); `sql_session()` a
Spark session with a dg project's feed tables by their feeds' names (a notebook's); the rest of the
Dagster side is in `feedapi_dagster.orchestration`.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from feedapi_dagster.orchestration.component import FeedApiComponent
    from feedapi_dagster.orchestration.sql_command import sql_session
    from feedapi_dagster.read.datasource import FeedDataSource

__all__ = ["FeedApiComponent", "FeedDataSource", "sql_session"]

# lazy: Spark executors import `feedapi_dagster.protocol` and the data source, never pyspark's
# session machinery or Dagster
_LAZY = {
    "FeedDataSource": "feedapi_dagster.read.datasource",
    "FeedApiComponent": "feedapi_dagster.orchestration.component",
    "sql_session": "feedapi_dagster.orchestration.sql_command",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
