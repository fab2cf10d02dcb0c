"""The Spark runtime: where Spark runs and how a run talks to it.

`SparkSettings` says where (an embedded Spark Connect server this installation starts and reuses, a
cluster's endpoint, a local session); `spark_session` makes the one session of a process; `answering`
bounds every call into Spark; the Delta and s3a jars are resolved once (`ensure_delta_jars`).
"""

from feedapi_dagster.spark.embedded import ensure_embedded_server
from feedapi_dagster.spark.jars import ensure_delta_jars
from feedapi_dagster.spark.sessions import local_spark_session, spark_session
from feedapi_dagster.spark.settings import SparkSettings, installation_port
from feedapi_dagster.spark.storage import S3Storage
from feedapi_dagster.spark.watchdog import answering, is_connect

__all__ = [
    "S3Storage",
    "SparkSettings",
    "answering",
    "ensure_delta_jars",
    "ensure_embedded_server",
    "installation_port",
    "is_connect",
    "local_spark_session",
    "spark_session",
]
