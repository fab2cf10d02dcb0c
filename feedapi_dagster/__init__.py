"""feedapi-dagster: FeedAPI event feeds into Delta Lake, read and written by Spark, orchestrated by Dagster.

`FeedDataSource` is the PySpark data source `feedapi` (usable without Dagster); the Dagster side is in
`feedapi_dagster.orchestration`.
"""
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from feedapi_dagster.lakehouse.datasource import FeedDataSource

__all__ = ["FeedDataSource"]


def __getattr__(name: str) -> Any:
    # lazy: `import feedapi_dagster.protocol` (on Spark executors too) does not import pyspark
    if name == "FeedDataSource":
        from feedapi_dagster.lakehouse.datasource import FeedDataSource

        return FeedDataSource
    raise AttributeError(name)
