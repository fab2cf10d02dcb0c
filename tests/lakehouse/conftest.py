import pytest

from feedapi_dagster.lakehouse.engines import DeltaRsEngine, SparkEngine
from feedapi_dagster.lakehouse.loader import FeedLoader, LoadSettings
from feedapi_dagster.lakehouse.sink import DeltaSink
from feedapi_dagster.protocol import FeedClient, RetryPolicy


@pytest.fixture
def table_path(tmp_path):
    return str(tmp_path / "lakehouse" / "feed")


@pytest.fixture(params=["deltalake", "spark"])
def writer(request):
    """Every sink test runs with both table engines (`writer:` in the feeds file). The Spark engine
    reads the Delta log with delta-rs when it can (always, here); tests about reading the log back
    also take `SPARK_LOG_TOO`: the Spark engine reading it through Spark, as on a cluster's storage."""
    return request.param


SPARK_LOG_TOO = pytest.mark.parametrize("writer", ["deltalake", "spark", "spark-sql-log"])


@pytest.fixture
def make_sink(spark, writer, table_path):
    def make(path=None, **kwargs):
        path = path or table_path
        engine = (DeltaRsEngine(path) if writer == "deltalake"
                  else SparkEngine(spark, path, read_log="spark" if writer == "spark-sql-log" else "auto"))
        return DeltaSink(path, engine=engine, **kwargs)
    return make


# Reader threads by default: a reader process costs ~1 s to start, and these loads are tiny. The
# reader processes (the product's default) are covered by test_readers.py, the crash and chaos tests.
THREADS = LoadSettings(read_processes=0)


@pytest.fixture
def make_loader(make_sink):
    def make(server, *, path=None, settings=None, **client_kwargs):
        client_kwargs.setdefault("retry", RetryPolicy(base_delay=0.001, max_delay=0.01))
        client = FeedClient(server.url, **client_kwargs)
        return FeedLoader(client, make_sink(path), settings or THREADS)
    return make


def table_rows(spark, path, partition_id):
    frame = spark.read.format("delta").load(path).where(f"partition_id = {partition_id}").orderBy("position")
    return frame.select("position", "payload", "payload_type", "event_id", "cursor").collect()


def payloads(spark, path, partition_id):
    return [row.payload for row in table_rows(spark, path, partition_id)]
