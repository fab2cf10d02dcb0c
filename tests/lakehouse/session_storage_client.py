"""A run's Spark session, made as a project's run makes it (`SparkResource(settings=
project.spark_settings())`), on the embedded Spark Connect server of a port: it appends rows to a Delta
table of the project's lakehouse, reads them back, and says what Spark shows of its settings.

    python session_storage_client.py SPEC_JSON

SPEC_JSON: ``{"port": ..., "lakehouse": ..., "storage": S3Storage as JSON or null, "rows": n}``, or with
``"create": true`` only create the project's feed table (`FeedTable.ensure_table`). Prints
one JSON line: ``count`` (the table's rows after the append), ``set`` (the ``fs.s3a.*`` lines of
``SET``), ``set_secret`` (``SET fs.s3a.secret.key``), ``explain`` (the extended plans of the read) or
``error`` (a failure's type and text, with its traceback), and ``seconds`` (the session's creation).
"""

import contextlib
import io
import json
import sys
import time
import traceback

from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.orchestration import FeedConfig, ProjectConfig, SparkResource
from feedapi_dagster.orchestration.config import StorageConfig
from feedapi_dagster.spark.settings import SparkSettings
from feedapi_dagster.spark.storage import S3Storage


def main() -> None:
    spec = json.loads(sys.argv[1])
    storage = S3Storage.model_validate_json(spec["storage"]) if spec["storage"] else None
    project = ProjectConfig(
        lakehouse=spec["lakehouse"],
        storage=StorageConfig(s3=storage),
        spark=SparkSettings(mode="embedded", port=spec["port"]),
        feeds=[FeedConfig(name="events", url="http://127.0.0.1:9/feed")],
    )
    path = project.table_path(project.feeds[0])
    out: dict = {}
    try:
        started = time.perf_counter()
        spark = SparkResource(settings=project.spark_settings()).spark_session
        out["seconds"] = round(time.perf_counter() - started, 3)
        if spec.get("create"):
            # the project's table, as a load creates it: a failure is a StorageError naming the setting
            FeedTable(spark, path, read_log="spark").ensure_table()
            return
        spark.range(spec["rows"]).withColumnRenamed("id", "n").write.format("delta").mode("append").save(path)
        frame = spark.read.format("delta").load(path)
        out["count"] = frame.count()
        out["set"] = [f"{row[0]}={row[1]}" for row in spark.sql("SET").collect() if row[0].startswith("fs.s3a.")]
        out["set_secret"] = [list(row) for row in spark.sql("SET fs.s3a.secret.key").collect()]
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown):
            frame.where("n > 0").explain(extended=True)
        out["explain"] = shown.getvalue()
    except Exception as error:  # noqa: BLE001 - reported to the test
        out["error"] = f"{type(error).__name__}: {error}"
        out["traceback"] = "".join(traceback.format_exception(error))
    finally:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
