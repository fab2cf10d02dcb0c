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
    def make(path=None, layout=None, **kwargs):
        table = lakehouse.feed_table(
            spark, path or table_path, read_log="spark" if read_log == "spark" else "auto", layout=layout
        )
        return DeltaSink(table, **kwargs)

    return make


def source(url, **options) -> FeedSettings:
    options.setdefault("retry", RetryPolicy(base_delay=0.001, max_delay=0.01))
    return feed_settings(url=url, **options)


@pytest.fixture
def make_loader(make_sink):
    def make(server, *, path=None, settings=None, on_moment=None, layout=None, **options):
        return FeedLoader(source(server.url, **options), make_sink(path, layout), settings, on_moment=on_moment)

    return make


def table_rows(spark, path, partition_id):
    frame = spark.read.format("delta").load(path).where(f"partition_id = {partition_id}").orderBy("position")
    return frame.select("position", "payload", "payload_type", "event_id", "cursor").collect()


def payloads(spark, path, partition_id):
    return [row.payload for row in table_rows(spark, path, partition_id)]


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
