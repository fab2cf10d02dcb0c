"""The executors' read: the `feedapi` PySpark data source (batch and streaming), its read tasks, and
the rows they make. Spark's Python workers import this package: nothing here imports Dagster or
pyspark's session machinery. `registration.register_feed_source` puts the source into a session."""

from feedapi_dagster.read.datasource import FeedDataSource
from feedapi_dagster.read.rows import EVENT_SCHEMA

__all__ = ["EVENT_SCHEMA", "FeedDataSource"]
