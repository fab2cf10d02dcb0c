"""The write of a `payload_form: columns` table's rows: the payload's top-level keys as typed columns,
inferred by Spark from the rows, planned by `planning.payload_columns`, written in the rows' commit.

`FeedTable.write` calls `typed_rows` on each attempt of a commit: a Spark job over the rows (which the
loader keeps, `localCheckpoint`, for a columns table: read from the feed once, looked at twice) counts
each key's shapes (`schema_of_variant` of its values, grouped: a handful of rows come back, whatever the
number of events); the plan, made against the table's schema as it is at that moment, says which
columns to add; the rows are projected (the keys every value of which fits its column parsed from the
payload's text by one `from_json` of the row, a key some values of which do not fit by `variant_get`
where they fit, the rest into `_rescued_data` as JSON) and written with `mergeSchema`, so the new columns and the rows that
bring them are one Delta commit. A commit that lost to another writer's schema change is retried by the
sink, and so planned again against the schema that won: two loads that add columns at once end with
both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from feedapi_dagster.lakehouse.payload_form import DATA_COLUMN, data_column
from feedapi_dagster.planning.column_types import quoted
from feedapi_dagster.planning.payload_columns import (
    DECLARED_METADATA,
    KEY_METADATA,
    RESCUE_COLUMN,
    ColumnsPlan,
    ColumnsSettings,
    KeyPlan,
    PayloadColumn,
    Shape,
    payload_columns_of,
    plan_columns,
)
from feedapi_dagster.read.rows import PARTITION_COLUMN, TABLE_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# the project's own columns: a payload key of one of these names gets another (`column_name`)
RESERVED_COLUMNS = (*TABLE_SCHEMA.names, DATA_COLUMN, RESCUE_COLUMN)
# `payload` where the feed's settings do not keep it: only where the typed columns cannot hold the payload
# (not an object, or one Spark's parser refused: `data` NULL; the write's unparsed count looks for those)
_PAYLOAD_KEPT_SQL = f"CASE WHEN payload_type = 'object' AND {DATA_COLUMN} IS NOT NULL THEN NULL ELSE payload END"
# the struct `_parsed_object` parses, for the projection only (not a name a payload column can take: `column_name`)
_PARSED = "feedapi parsed object"

_SHAPES_SQL = (
    f"SELECT kv.key, schema_of_variant(kv.value) AS shape, count(*) AS rows, min(r.{PARTITION_COLUMN}) AS partition "
    f"FROM {{rows}} AS r, LATERAL variant_explode(r.{DATA_COLUMN}) AS kv WHERE kv.key IS NOT NULL GROUP BY 1, 2"
)


@dataclass(frozen=True)
class TypedRows:
    """Rows ready for a columns table's write, and the plan they follow."""

    frame: DataFrame
    plan: ColumnsPlan


def sql_string(text: str) -> str:
    """`text` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def key_path(key: str) -> str | None:
    """The variant path of a top-level key; None for a key a path cannot name (both quotes in it)."""
    if "'" not in key:
        return f"$['{key}']"
    return f'$["{key}"]' if '"' not in key else None


def shapes_of(rows: DataFrame) -> list[Shape]:
    """Each top-level key of the rows' object payloads with each shape its value has (one Spark job)."""
    spark = rows.sparkSession
    found = spark.sql(_SHAPES_SQL, rows=rows.select(PARTITION_COLUMN, DATA_COLUMN)).collect()
    return [Shape(row["key"], row["shape"], row["rows"], row["partition"]) for row in found]


def table_payload_columns(table: DataFrame) -> list[PayloadColumn]:
    """The payload columns of a table (its frame: Spark reads its schema, field metadata included)."""
    return payload_columns_of(table.schema.jsonValue())


def typed_rows(rows: DataFrame, existing: Sequence[PayloadColumn], settings: ColumnsSettings) -> TypedRows:
    """`rows` (the table's columns but the payload's, and maybe `data`) as a columns table takes them, planned against
    its payload columns `existing`, with `data` (the payload parsed, for the write's counts to look at:
    drop it before the write). `PayloadSchemaFrozen` where `settings` freeze the schema and a key is new."""
    from pyspark.sql import functions as F

    # a kept read of a columns table holds the payload parsed already (`LoadExecution._read`)
    with_data = rows if DATA_COLUMN in rows.columns else rows.withColumn(DATA_COLUMN, data_column())
    plan = plan_columns(existing, shapes_of(with_data), settings, RESERVED_COLUMNS)
    parsed = _parsed_whole(plan.keys)
    parsed_keys = {key_plan.key for key_plan in parsed}
    typed = [_typed_column(k) for k in plan.keys if k.column is not None and k.key not in parsed_keys]
    in_rows = {key_plan.key for key_plan in plan.keys}
    # a declared column no row has yet: in the frame all the same, so that the write adds it
    absent = [_null_column(column) for column in plan.added if column.key not in in_rows]
    columns = [F.col(quoted(name)) for name in with_data.columns]
    if not settings.keep_payload:  # what the typed columns and `_rescued_data` hold is not kept twice
        columns[with_data.columns.index("payload")] = F.expr(_PAYLOAD_KEPT_SQL).alias("payload")
    if parsed:  # a projection of its own: Spark parses each row once, however many columns read the struct
        with_data = with_data.select("*", _parsed_object(parsed))
    parsed_columns = [_parsed_column(key_plan) for key_plan in parsed]
    rescued = _rescued(plan.keys).alias(RESCUE_COLUMN)
    frame = with_data.select(*columns, *parsed_columns, *typed, *absent, rescued)
    return TypedRows(frame, plan)


def _parsed_whole(keys: Sequence[KeyPlan]) -> list[KeyPlan]:
    """The keys every value of which fits its column as it is (no misfit shape, no declared cast): read
    from the payload's text by one `from_json` of the row (`_parsed_object`). Not keys equal to another
    but for case (`Amount` beside `amount`): a field of the struct is found by its name, and Spark
    compares names ignoring case; those go by `variant_get`."""
    whole = [k for k in keys if k.column is not None and not k.misfits and not k.cast_checked]
    folded = Counter(_folded(k.key) for k in keys)
    return [k for k in whole if folded[_folded(k.key)] == 1]


def _folded(key: str) -> str:
    """`key` as equal as Spark's comparison ignoring case makes it, or more (Java's `equalsIgnoreCase`
    compares characters upper-cased, then lower-cased)."""
    return key.upper().lower()


def _parsed_object(keys: Sequence[KeyPlan]) -> Column:
    """The keys' values, typed, as one struct parsed from each object payload's text by `from_json`.

    Why not `variant_get` of `data`: Spark casts a variant's scalars one by one through its generic cast
    (measured: each top-level scalar column ~1.7 us an event, the demo's nested object ~10 us), while its
    JSON reader types a whole row in one pass (the demo's rows: about half the time). They agree exactly
    on values whose shape fits the column (`misfit`: strings as strings, integers as integers, numbers
    as the double nearest them, objects and arrays field by field, a VARIANT's JSON null a variant null),
    which are the only ones given to it. A payload Spark's variant parser refused (`data` SQL NULL) gets
    no typed value, as before."""
    from pyspark.sql import functions as F

    fields = ", ".join(f"{quoted(k.key)}: {k.column.type.ddl()}" for k in keys if k.column is not None)
    parse = f"from_json(payload, {sql_string(f'STRUCT<{fields}>')})"
    return F.expr(f"CASE WHEN payload_type = 'object' AND {DATA_COLUMN} IS NOT NULL THEN {parse} END").alias(_PARSED)


def _parsed_column(key_plan: KeyPlan) -> Column:
    from pyspark.sql import functions as F

    assert key_plan.column is not None
    value = F.col(_PARSED).getField(key_plan.key)
    return value.alias(key_plan.column.name, metadata=_metadata(key_plan.column))


def _metadata(column: PayloadColumn) -> dict[str, object]:
    return {KEY_METADATA: column.key, **({DECLARED_METADATA: True} if column.declared else {})}


def _value(key: str) -> str:
    """The key's value in a row's payload (a variant; NULL where it has none)."""
    path = key_path(key)
    if path is None:  # the payload as a map of its keys (a cast of the whole row's: only for such keys)
        return f"try_variant_get({DATA_COLUMN}, '$', 'map<string,variant>')[{sql_string(key)}]"
    return f"variant_get({DATA_COLUMN}, {sql_string(path)})"


def _fits(key_plan: KeyPlan) -> str:
    if not key_plan.misfits:
        return "TRUE"
    shapes = ", ".join(sql_string(shape) for shape in key_plan.misfits)
    return f"schema_of_variant({_value(key_plan.key)}) NOT IN ({shapes})"


def _typed_sql(key_plan: KeyPlan) -> str:
    assert key_plan.column is not None
    ddl = sql_string(key_plan.column.type.ddl())
    # An inferred column's values are cast only where their shape fits it exactly (`misfit`): such a cast
    # cannot fail, and one that did would be a bug to see, not a NULL to hide (`variant_get` raises). A
    # declared column's cast may fail: `try_`, and the value is rescued (`_rescued_when`).
    get = "try_variant_get" if key_plan.cast_checked else "variant_get"
    path = key_path(key_plan.key)
    if path is None:
        return f"{get}({_value(key_plan.key)}, '$', {ddl})"
    return f"{get}({DATA_COLUMN}, {sql_string(path)}, {ddl})"


def _typed_column(key_plan: KeyPlan) -> Column:
    from pyspark.sql import functions as F

    assert key_plan.column is not None
    typed = _typed_sql(key_plan)
    sql = typed if not key_plan.misfits else f"CASE WHEN {_fits(key_plan)} THEN {typed} END"
    return F.expr(sql).alias(key_plan.column.name, metadata=_metadata(key_plan.column))


def _null_column(column: PayloadColumn) -> Column:
    from pyspark.sql import functions as F

    return F.expr(f"CAST(NULL AS {column.type.ddl()})").alias(column.name, metadata=_metadata(column))


def _rescued_when(key_plan: KeyPlan) -> str:
    """When a row's value of the key goes to `_rescued_data`: it has one, not JSON null, and it has no
    column, or does not fit it, or (a declared column) Spark could not cast it."""
    value = _value(key_plan.key)
    present = f"{value} IS NOT NULL AND NOT is_variant_null({value})"
    if key_plan.column is None:
        return present
    why = [] if not key_plan.misfits else [f"NOT ({_fits(key_plan)})"]
    if key_plan.cast_checked:
        why.append(f"{_typed_sql(key_plan)} IS NULL")
    return f"{present} AND ({' OR '.join(why)})"


def _rescued(keys: Sequence[KeyPlan]) -> Column:
    """`_rescued_data`: the rescued values of a row as a JSON object under their keys; NULL for none."""
    from pyspark.sql import functions as F

    rescuing = [key_plan for key_plan in keys if key_plan.rescues]
    if not rescuing:
        return F.lit(None).cast("string")
    # `to_json` leaves out a struct's NULL fields: the values not rescued
    fields = ", ".join(f"{sql_string(k.key)}, CASE WHEN {_rescued_when(k)} THEN {_value(k.key)} END" for k in rescuing)
    return F.expr(f"nullif(to_json(named_struct({fields})), '{{}}')")
