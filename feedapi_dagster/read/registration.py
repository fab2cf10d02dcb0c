"""The `feedapi` data source's registration in a Spark session, where it is read (the batch loads and
the Dagster stream do it before their first read), with what the session's Python workers need to
import it: this package for a cluster without it, and a user's protocol's package for every Connect
server (`spark.artifacts`)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from feedapi_dagster.protocol.registry import DEFAULT_PROTOCOL, protocol_module
from feedapi_dagster.read.datasource import FeedDataSource
from feedapi_dagster.spark.artifacts import package_zip, protocol_zip
from feedapi_dagster.spark.failures import is_source_name_taken
from feedapi_dagster.spark.watchdog import is_connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Sessions that have the `feedapi` data source (weakly: an id() of a collected session is reused).
_with_source: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def register_feed_source(spark: SparkSession, ship: bool = False, protocol: str = DEFAULT_PROTOCOL) -> None:
    """Register `FeedDataSource` as `feedapi` in the session, once (`FeedLoader` and `FeedStream` do,
    before their first read). `ship`: also send this package to the session's executors as a Spark
    Connect artifact (a cluster whose Python does not have feedapi-dagster installed; its wheels -
    msgspec, pyarrow, requests, pydantic - must be there). `protocol`: the feed's; a user's protocol's package goes to
    a Connect session's Python workers with each load (`protocol_zip`; a local session's workers are
    this process's environment's)."""
    module = protocol_module(protocol)
    if module is not None and is_connect(spark):
        spark.addArtifacts(str(protocol_zip(module)), pyfile=True)
    if spark in _with_source:
        return
    if ship:
        spark.addArtifacts(str(package_zip()), pyfile=True)
    try:
        spark.dataSource.register(FeedDataSource)
    except Exception as error:
        # Spark checks the name, then registers, without a lock (`DataSourceRegistration.
        # checkDataSourceExists`): not registered in the session yet, so it looks the name up as any
        # data source, and finds the `feedapi` that another client of the same server-side session
        # (every client of the embedded server: `SparkConnectServer.client_url`) registered in between.
        # Registered now, so the name passes the check this time; a JVM source named `feedapi` (the
        # check's real purpose) fails it again.
        if not is_source_name_taken(error):
            raise
        spark.dataSource.register(FeedDataSource)
    _with_source.add(spark)
