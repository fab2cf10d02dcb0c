"""The Delta table of a feed: its schema, and how a batch of raw events becomes its rows.

Python hands Spark only what it has anyway (partition, position, cursor and each payload's raw JSON
text, as Arrow); the JVM derives the payload type, the string value of string payloads and the
event id. `get_json_object` returns the unescaped value of a JSON string, so string payloads are
stored as the string itself while object payloads keep the exact bytes the feed sent.
"""
from __future__ import annotations

import re
from itertools import accumulate
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TABLE_COLUMNS = (
    ("partition_id", "INT"),
    ("position", "BIGINT"),
    ("cursor", "STRING"),
    ("payload", "STRING"),
    ("payload_type", "STRING"),
    ("event_id", "STRING"),
    ("loaded_at", "TIMESTAMP"),
    ("run_id", "STRING"),
)
TABLE_DDL = ", ".join(f"{name} {kind}" for name, kind in TABLE_COLUMNS)
ARROW_SCHEMA = pa.schema([
    ("partition_id", pa.int32()), ("position", pa.int64()), ("cursor", pa.string()), ("raw", pa.string()),
])
_ID_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_id_field(event_id_field: str) -> str:
    if not _ID_FIELD.fullmatch(event_id_field):
        raise ValueError(f"event_id_field must be a plain field name ([A-Za-z_][A-Za-z0-9_]*), got {event_id_field!r}")
    return event_id_field


def ensure_table(spark: "SparkSession", path: str) -> None:
    try:
        spark.sql(f"CREATE TABLE IF NOT EXISTS delta.`{path}` ({TABLE_DDL}) USING delta PARTITIONED BY (partition_id)")
    except Exception as error:  # noqa: BLE001 - Spark's error types differ between classic and Connect
        # Two first loads racing to create the table: the loser's CREATE conflicts; the table exists.
        if "DELTA_PROTOCOL_CHANGED" not in str(error) and "already exists" not in str(error):
            raise


def arrow_batch(partition_ids: list[int], positions: list[int], cursors: list[str], raws: list[bytes]) -> pa.Table:
    """Columns of raw events; `raws` are UTF-8 JSON texts already validated by the page reader."""
    offsets = pa.array(list(accumulate(map(len, raws), initial=0)), pa.int32())
    raw = pa.StringArray.from_buffers(len(raws), offsets.buffers()[1], pa.py_buffer(b"".join(raws)))
    return pa.Table.from_arrays(
        [pa.array(partition_ids, pa.int32()), pa.array(positions, pa.int64()), pa.array(cursors, pa.string()), raw],
        schema=ARROW_SCHEMA,
    )


def rows_frame(spark: "SparkSession", batch: pa.Table, event_id_field: str, run_id: str | None) -> "DataFrame":
    from pyspark.sql import functions as F

    raw = F.col("raw")
    first = F.substring(raw, 1, 1)
    payload_type = (F.when(first == "{", "object").when(first == '"', "string").when(first == "[", "array")
                    .when(first.isin("t", "f"), "boolean").when(first == "n", "null").otherwise("number"))
    string_value = F.get_json_object(F.concat(F.lit('{"v":'), raw, F.lit("}")), "$.v")
    frame = spark.createDataFrame(batch) if batch.num_rows else spark.createDataFrame([], _empty_schema())
    return frame.select(
        F.col("partition_id"),
        F.col("position"),
        F.col("cursor"),
        F.when(first == '"', string_value).otherwise(raw).alias("payload"),
        payload_type.alias("payload_type"),
        F.when(first == "{", F.get_json_object(raw, f"$.{event_id_field}")).alias("event_id"),
        F.current_timestamp().alias("loaded_at"),
        F.lit(run_id).cast("string").alias("run_id"),
    )


def _empty_schema() -> str:
    return "partition_id INT, position BIGINT, cursor STRING, raw STRING"
