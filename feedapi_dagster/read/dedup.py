"""At-least-once feeds: the rows read whose event id the table already holds are dropped, by Spark,
by the one commit of a read (`lakehouse/commit.py`) of batch loads and streams' micro-batches alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

from feedapi_dagster.planning import PartitionState
from feedapi_dagster.protocol import FeedInfo

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def dedup_group(info: FeedInfo, partition_id: int) -> list[int]:
    """A partition and its method-2 ancestors: their histories overlap."""
    partition = info.partition(partition_id)
    return [partition_id, *(partition.cursor_from if partition else [])]


def without_stored(
    rows: DataFrame, table: DataFrame, groups: dict[int, list[int]], starts: dict[int, PartitionState]
) -> tuple[DataFrame, dict[int, int]]:
    """The rows read whose event id the table does not hold in the partition's dedup group, with
    positions renumbered to stay contiguous from each partition's start; and the kept rows per
    partition."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    spark = rows.sparkSession
    pairs = [(pid, source) for pid, group in groups.items() for source in group]
    sources = sorted({source for _, source in pairs})
    mapping = spark.createDataFrame(pairs, "partition_id INT, source INT")
    stored = (
        table.where(F.col("partition_id").isin(sources) & F.col("event_id").isNotNull())
        .select(F.col("partition_id").alias("source"), "event_id")
        .distinct()
    )
    repeated = (
        rows.where(F.col("event_id").isNotNull())
        .select("partition_id", "event_id")
        .join(mapping, "partition_id")
        .join(stored, ["source", "event_id"])
        .select("partition_id", "event_id")
        .distinct()
    )
    starts_frame = spark.createDataFrame(
        [(pid, s.position) for pid, s in starts.items()], "partition_id INT, start BIGINT"
    )
    order = Window.partitionBy("partition_id").orderBy("position")
    kept = (
        rows.join(repeated, ["partition_id", "event_id"], "left_anti")
        .join(F.broadcast(starts_frame), "partition_id")
        .withColumn("position", F.col("start") + F.row_number().over(order) - 1)
        .select(*rows.columns)
    )
    counts = {row[0]: row[1] for row in kept.groupBy("partition_id").count().collect()}
    return kept, counts
