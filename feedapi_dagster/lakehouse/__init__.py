"""The lakehouse: a feed's Delta table and the commits that land its rows with the cursor of record.

What the orchestration side uses: `FeedLoader` (a batch load) and its `PartitionReport`s,
`FeedStream` (the Dagster stream), both committing through `ReadCommit`, `FeedTable` (the table),
`read_committed_state` (the cursor of record), the table's statistics, deletes and maintenance. The Spark runtime is `feedapi_dagster.spark`, the executors' read
`feedapi_dagster.read`.
"""

from feedapi_dagster.lakehouse.commit import ReadCommit
from feedapi_dagster.lakehouse.cursor_record import CommittedState, read_committed_state
from feedapi_dagster.lakehouse.deletes import UserDeletes, count_user_deletes
from feedapi_dagster.lakehouse.delta_log import DeltaLog, Layout
from feedapi_dagster.lakehouse.feed_stream import FeedStream
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.lakehouse.load_report import LoadOutcome, LoadStatus, PartitionReport
from feedapi_dagster.lakehouse.load_settings import LoadSettings
from feedapi_dagster.lakehouse.loader import FeedLoader
from feedapi_dagster.lakehouse.maintenance import MaintenanceReport, MaintenanceSettings, due, maintain
from feedapi_dagster.lakehouse.stats import NO_ROWS, PartitionStats, duplicate_event_ids, partition_stats

__all__ = [
    "NO_ROWS",
    "CommittedState",
    "DeltaLog",
    "FeedLoader",
    "FeedStream",
    "FeedTable",
    "Layout",
    "LoadOutcome",
    "LoadSettings",
    "LoadStatus",
    "MaintenanceReport",
    "MaintenanceSettings",
    "PartitionReport",
    "PartitionStats",
    "ReadCommit",
    "UserDeletes",
    "count_user_deletes",
    "due",
    "duplicate_event_ids",
    "maintain",
    "partition_stats",
    "read_committed_state",
]
