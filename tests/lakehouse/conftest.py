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
    def make(path=None, layout=None, payload_form=None, **kwargs):
        table = lakehouse.feed_table(
            spark,
            path or table_path,
            read_log="spark" if read_log == "spark" else "auto",
            layout=layout,
            payload_form=payload_form,
        )
        return DeltaSink(table, **kwargs)

    return make


def source(url, **options) -> FeedSettings:
    options.setdefault("retry", RetryPolicy(base_delay=0.001, max_delay=0.01))
    return feed_settings(url=url, **options)


@pytest.fixture
def make_loader(make_sink):
    def make(server, *, path=None, settings=None, on_moment=None, layout=None, payload_form=None, **options):
        sink = make_sink(path, layout, payload_form)
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
