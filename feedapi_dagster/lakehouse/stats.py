"""What a feed table holds per partition: from the Delta log's file statistics where they suffice,
else from a read of two columns.

A partitioned table (`PARTITIONED BY (partition_id)`, a folder per feed partition: tables created
up to 0.1.0): row counts and position bounds of a partition are in the log (`numRecords`, `minValues`,
`maxValues` of every data file, each of one partition): reading them costs milliseconds whatever the
table's size. A clustered table (`CLUSTER BY (partition_id)`, the default layout) or one of no layout:
a data file holds rows of many partitions, so its statistics give no per-partition count; delta-rs
reads the columns `partition_id` and `position` of the files whose min/max `partition_id` admit the
partitions asked for, and Arrow groups them (hundredths of a second for 10,000 small partitions,
`benchmarks/README.md`; it grows with the rows of those files, where the log's statistics do not). Whether event ids repeat is not in any
statistic: that takes a scan of the given partitions (for at-least-once feeds; an exactly-once
feed's loads count repeats as they read).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from feedapi_dagster.lakehouse.delta_log import DeltaLog
from feedapi_dagster.lakehouse.feed_table import FeedTable, in_partitions
from feedapi_dagster.read.rows import PARTITION_COLUMN
from feedapi_dagster.spark.failures import first_line

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionStats:
    rows: int
    min_position: int | None
    max_position: int | None

    def contiguous(self, committed_position: int, deleted_by_user: int = 0, deletes_exact: bool = True) -> bool:
        """Rows at positions within 0..n-1, n the committed position, as many as n less the rows a
        user's DELETE removed (`deletes.py`). Positions are unique by construction of the loader: so
        many rows within those bounds leave no room for a gap or a repeat. `deletes_exact` False (the
        DELETEs before the log's oldest commit are not known): no more rows than that."""
        within = self.rows == 0 or (
            self.min_position is not None
            and self.max_position is not None
            and self.min_position >= 0
            and self.max_position < committed_position
        )
        expected = committed_position - deleted_by_user
        return within and (self.rows == expected if deletes_exact else self.rows <= expected)


NO_ROWS = PartitionStats(0, None, None)


def partition_stats(table: FeedTable, partition_ids: Iterable[int]) -> dict[int, PartitionStats]:
    """Rows and position bounds of each partition (partitions without rows are left out)."""
    wanted = {int(p) for p in partition_ids}
    if not wanted:
        return {}
    log = table.delta_log
    if log is not None:
        if log.partitioned():
            return _from_log(log, wanted)
        try:
            return _from_columns(log, wanted)
        except Exception as error:  # noqa: BLE001 - delta-rs raises many types
            # what delta-rs does not read (deletion vectors, column mapping a user turned on): Spark does
            _log.info(
                "the positions of %s are read by Spark: delta-rs cannot read its rows here (%s: %s)",
                table.path,
                type(error).__name__,
                first_line(error, 200),
            )
    # storage only the cluster reaches: Spark answers from the same statistics (Delta's
    # metadata-only aggregation) or, where it cannot, reads the columns of these partitions
    from pyspark.sql import functions as F

    rows = (
        table.frame()
        .where(in_partitions(wanted))
        .groupBy(PARTITION_COLUMN)
        .agg(F.count("*"), F.min("position"), F.max("position"))
        .collect()
    )
    return {r[0]: PartitionStats(r[1], r[2], r[3]) for r in rows}


def _from_log(log: DeltaLog, wanted: set[int]) -> dict[int, PartitionStats]:
    actions = log.add_actions()
    stats: dict[int, PartitionStats] = {}
    for partition, rows, low, high in zip(
        actions[f"partition.{PARTITION_COLUMN}"],
        actions["num_records"],
        actions["min.position"],
        actions["max.position"],
        strict=True,
    ):
        if partition is None or int(partition) not in wanted:
            continue
        partition = int(partition)
        seen = stats.get(partition)
        if seen is None:
            stats[partition] = PartitionStats(rows, low, high)
        else:
            stats[partition] = PartitionStats(
                seen.rows + rows, min(seen.min_position, low), max(seen.max_position, high)
            )
    return stats


def _from_columns(log: DeltaLog, wanted: set[int]) -> dict[int, PartitionStats]:
    """A clustered table's: its rows' `partition_id` and `position`, read by delta-rs, grouped by Arrow."""
    import pyarrow.compute as pc

    columns = log.partition_columns(wanted=wanted)
    grouped = (
        columns.group_by(PARTITION_COLUMN)
        .aggregate([("position", "count", pc.CountOptions(mode="all")), ("position", "min"), ("position", "max")])
        .to_pydict()
    )
    return {
        int(p): PartitionStats(rows, low, high)
        for p, rows, low, high in zip(
            grouped[PARTITION_COLUMN],
            grouped["position_count"],
            grouped["position_min"],
            grouped["position_max"],
            strict=True,
        )
    }


def duplicate_event_ids(table: FeedTable, partition_ids: Iterable[int], limit: int = 20) -> list[str]:
    """Event ids stored more than once in one of the partitions (a scan of their id column)."""
    wanted = sorted({int(p) for p in partition_ids})
    if not wanted:
        return []
    rows = (
        table.frame()
        .where(f"{in_partitions(wanted)} AND event_id IS NOT NULL")
        .groupBy(PARTITION_COLUMN, "event_id")
        .count()
        .where("count > 1")
        .limit(limit)
        .collect()
    )
    return [f"partition {r[0]}: {r[1]} x{r[2]}" for r in rows]
