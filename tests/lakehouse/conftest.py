import json

import pytest

from feedapi_dagster.lakehouse.loader import FeedLoader
from feedapi_dagster.lakehouse.sink import DeltaSink
from feedapi_dagster.protocol import FeedSettings, RetryPolicy, feed_settings


@pytest.fixture
def table_path(lakehouse):
    """The test's feed table: on local disk, or on the S3 server for a test parametrized with
    `ON_S3` (or `lakehouse` "s3")."""
    return lakehouse.table()


ON_S3 = pytest.mark.parametrize("lakehouse", ["s3"], indirect=True)


@pytest.fixture
def read_log(request):
    """How the run reads the Delta log (the committed states): delta-rs where the run can open the
    table, Spark (`DESCRIBE HISTORY`) where only the cluster reaches the storage. Tests about reading
    the log back run with both (`LOG_READERS`); the others with delta-rs."""
    return getattr(request, "param", "delta-rs")


LOG_READERS = pytest.mark.parametrize("read_log", ["delta-rs", "spark"], indirect=True)


@pytest.fixture
def make_sink(spark, table_path, read_log, lakehouse):
    def make(path=None, layout=None, payload_form=None, columns=None, **kwargs):
        table = lakehouse.feed_table(
            spark,
            path or table_path,
            read_log="spark" if read_log == "spark" else "auto",
            layout=layout,
            payload_form=payload_form,
            columns=columns,
        )
        return DeltaSink(table, **kwargs)

    return make


def source(url, **options) -> FeedSettings:
    options.setdefault("retry", RetryPolicy(base_delay=0.001, max_delay=0.01))
    return feed_settings(url=url, **options)


@pytest.fixture
def make_loader(make_sink):
    def make(
        server, *, path=None, settings=None, on_moment=None, layout=None, payload_form=None, columns=None, **options
    ):
        sink = make_sink(path, layout, payload_form, columns)
        return FeedLoader(source(server.url, **options), sink, settings, on_moment=on_moment)

    return make


def table_rows(spark, path, partition_id):
    frame = spark.read.format("delta").load(path).where(f"partition_id = {partition_id}").orderBy("position")
    return frame.select("position", "payload", "payload_type", "event_id", "cursor").collect()


def payloads(spark, path, partition_id):
    return [row.payload for row in table_rows(spark, path, partition_id)]


# Payloads of every kind for a variant table (`add_event` texts): nested objects and arrays, a string with
# escapes, numbers, null, a boolean, an array; and two that Spark's JSON parser refuses although Python's
# takes them (an unpaired surrogate escape; a key twice in one object), whose `data` is NULL.
ODD_PAYLOADS = [
    '{"id":"odd-1","amount":150,"customer":{"name":"Zo\u00eb","tags":["a","b"]},"items":[{"sku":"x","qty":2}]}',
    '"a string payload with \\"quotes\\" and \\u00e9"',
    "42",
    "-3.25",
    "null",
    "true",
    '[1,"two",{"three":3},null]',
    '{"id":"odd-2","amount":7,"note":null}',
]
UNPARSEABLE = ['{"id":"odd-3","text":"\\ud800 unpaired"}', '{"id":"odd-4","amount":1,"amount":2}']


def add_odd_events(feed, partition=0, tag="") -> list[str]:
    """Publishes `ODD_PAYLOADS` and `UNPARSEABLE` on `partition` (`tag` in their ids: `odd<tag>-1`);
    returns the texts `payload` holds of the unparseable ones."""
    texts = [text.replace('"odd-', f'"odd{tag}-') for text in [*ODD_PAYLOADS, *UNPARSEABLE]]
    for text in texts:
        feed.add_event(text, partition=partition)
    return texts[len(ODD_PAYLOADS) :]


def assert_data_is_the_payload(spark, path, unparseable=(), where="true") -> int:
    """Every row of a variant table (`where` it holds): `data` is its payload parsed (a string payload:
    that string), but for the payloads `unparseable` (their text), whose `data` is NULL with the text
    kept in `payload`. Returns the number of rows compared."""
    frame = spark.read.format("delta").load(path).where(where)
    rows = frame.selectExpr("payload", "payload_type", "to_json(data) AS data").collect()
    unparseable = set(unparseable)
    for row in rows:
        if row.payload in unparseable:
            assert row.data is None, row
            continue
        assert row.data is not None, row
        expected = row.payload if row.payload_type == "string" else json.loads(row.payload)
        assert json.loads(row.data) == expected, row
    assert unparseable <= {row.payload for row in rows}  # each of them loaded
    return len(rows)


def unparsed_rows(spark, path) -> dict[int, int]:
    """The partitions of a variant table with rows whose payload Spark could not parse, and how many each."""
    frame = spark.read.format("delta").load(path).where("data IS NULL AND payload IS NOT NULL")
    return {row.partition_id: row["count"] for row in frame.groupBy("partition_id").count().collect()}


def create_partitioned_table(spark, path):
    """The table as releases up to 0.1.0 created it: a folder per feed partition, statistics of
    `position` only. Loads must go on with it as it is (it is never rewritten)."""
    from feedapi_dagster.lakehouse.feed_table import TABLE_DDL

    spark.sql(
        f"CREATE TABLE delta.`{path}` ({TABLE_DDL}) USING delta PARTITIONED BY (partition_id) "
        "TBLPROPERTIES ('delta.dataSkippingStatsColumns' = 'position')"
    )


def table_layout(spark, path) -> tuple[list[str], list[str], dict[str, str]]:
    """The table's partition columns, clustering columns and properties (`DESCRIBE DETAIL`)."""
    row = (
        spark.sql(f"DESCRIBE DETAIL delta.`{path}`")
        .select("partitionColumns", "clusteringColumns", "properties")
        .first()
    )
    return list(row[0]), list(row[1] or []), dict(row[2] or {})


def _matches(typed, value) -> bool:
    """Whether a typed value (as Spark hands it to Python) is the JSON `value`: a struct its object without
    the null fields (a struct's NULL field is the key absent), a VARIANT the value itself, a DOUBLE the
    double nearest the number (as every JSON reader's double), a DECIMAL the number exactly."""
    from pyspark.sql import Row
    from pyspark.sql.types import VariantVal

    if isinstance(typed, VariantVal):
        return json.loads(typed.toJson()) == value
    if isinstance(typed, Row):
        fields = {k: v for k, v in typed.asDict().items() if v is not None}
        given = {k: v for k, v in value.items() if v not in (None, [], {}) or k in fields}
        return (
            isinstance(value, dict)
            and fields.keys() == given.keys()
            and all(_matches(fields[k], value[k]) for k in fields)
        )
    if isinstance(typed, list):
        return isinstance(value, list) and len(typed) == len(value) and all(map(_matches, typed, value))
    if isinstance(typed, float):
        return isinstance(value, int | float) and not isinstance(value, bool) and float(value) == typed
    return bool(typed == value)


def _says_no_type(value) -> bool:
    """null, [] or {}, or objects and arrays of nothing else: a value whose type is not said."""
    if isinstance(value, dict):
        return all(map(_says_no_type, value.values()))
    if isinstance(value, list):
        return all(map(_says_no_type, value))
    return value is None


def assert_columns_are_the_payload(spark, path, unparseable=(), where="true", sent=None) -> dict[int, int]:
    """Every row of a columns table (`where` it holds) against its payload: each key of an object payload
    is in its typed column with the payload's value (a VARIANT column: the value itself), or in
    `_rescued_data` under the key with the payload's value, or has a value that says no type (null, [],
    {}) and no column; no typed column has a value its payload has not; a payload Spark's parser refuses
    (`unparseable`) and a non-object payload have no typed value. `sent`: {(partition, position): the
    payload's text as the feed sent it} of a table that does not keep the text of parsed objects
    (`keep_payload` false): each row's values are compared with that, and its `payload` is NULL exactly
    where the row is such an object. Returns the rows with rescued values, per partition."""
    from pyspark.sql.types import VariantVal

    from feedapi_dagster.lakehouse.typed_columns import table_payload_columns

    frame = spark.read.format("delta").load(path)
    columns = {column.key: column.name for column in table_payload_columns(frame)}
    rows = frame.where(where).collect()
    rescued_rows: dict[int, int] = {}
    for row in rows:
        typed = {key: row[name] for key, name in columns.items() if row[name] is not None}
        rescued = json.loads(row["_rescued_data"]) if row["_rescued_data"] is not None else {}
        if rescued:
            rescued_rows[row.partition_id] = rescued_rows.get(row.partition_id, 0) + 1
        text = row.payload if sent is None else sent[row.partition_id, row.position]
        if sent is not None:  # the text kept only where the columns cannot hold the payload
            typed_object = row.payload_type == "object" and text not in unparseable
            assert row.payload == (None if typed_object else text), row
        if row.payload_type != "object" or text in unparseable:
            assert not typed and not rescued, row
            continue
        payload = json.loads(text)
        assert set(typed) <= set(payload), row
        for key, value in payload.items():
            if key in rescued:
                assert rescued[key] == value and key not in typed, (key, row)
            elif key in typed:
                assert _matches(typed[key], value), (key, typed[key], row)
                # a JSON null has a value only in a VARIANT column: a variant null (`is_variant_null`)
                assert value is not None or isinstance(typed[key], VariantVal), (key, row)
            else:
                assert _says_no_type(value), (key, row)
    return rescued_rows
