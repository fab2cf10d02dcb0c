"""The Spark session of a run: dagster-pyspark's resource, pointed at the embedded server or a cluster."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Optional

import dagster as dg
from dagster_pyspark import LazyPySparkResource, PySparkResource

from feedapi_dagster.lakehouse.sessions import is_connect, register_feed_source, spark_session
from feedapi_dagster.lakehouse.spark_conf import DEFAULT_PORT, SparkSettings
from feedapi_dagster.lakehouse.storage import S3Storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


_BY_SETTINGS: dict[str, "SparkResource"] = {}


class SparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy session (`.spark_session`, created on first use and shared by every
    partition the run loads), configured by mode:

    `embedded` (default): a Spark Connect client of the project's local Spark Connect server (started
    on first use and left running, so later runs only pay for a ~1 s client); `remote`: a cluster's
    Spark Connect URL (`sc://host:15002`); `local`: Spark inside the run process (tests).
    `spark_config`: for `embedded` and `local`, configuration of the server / session; for `remote`,
    runtime SQL settings of the client session.
    """

    spark_config: dict[str, Any] = {}
    mode: Literal["embedded", "remote", "local"] = "embedded"
    remote: str | None = None
    port: int = DEFAULT_PORT
    # remote: send this package to the cluster as a Spark Connect artifact (off when the cluster's
    # Python has feedapi-dagster installed)
    ship_package: bool = True
    # the lakehouse's S3 storage (`S3Storage` fields; credentials by the names of their variables, read
    # when the session is made): every session gets its s3a settings and credentials
    s3: Optional[dict[str, Any]] = None

    @classmethod
    def from_settings(cls, settings: SparkSettings) -> "SparkResource":
        """One resource per distinct settings in a process: the Definitions of two components (two
        defs.yaml) with the same Spark merge into one code location under the same key."""
        key = settings.model_dump_json()
        if key not in _BY_SETTINGS:
            _BY_SETTINGS[key] = cls(mode=settings.mode, remote=settings.remote, port=settings.port,
                                    spark_config=settings.conf, ship_package=settings.ship_package,
                                    s3=settings.s3.model_dump(exclude_none=True) if settings.s3 is not None else None)
        return _BY_SETTINGS[key]

    def settings(self) -> SparkSettings:
        return SparkSettings(mode=self.mode, remote=self.remote, port=self.port, conf=self.spark_config,
                             detach_server=True, ship_package=self.ship_package,
                             s3=S3Storage(**self.s3) if self.s3 is not None else None)

    # LazyPySparkResource has no public hook for how its session is made: `_init_session` is what its
    # `spark_session` property calls, once, and `_spark_session` where it keeps the session
    # (dagster-pyspark 0.29). Overriding them keeps the base class's laziness and teardown.
    def _init_session(self) -> None:
        if self._spark_session is None:
            # validates mode and remote, with the same messages as the feeds config; the run's log
            # says which Spark it is, where its UI is, and when the embedded server starts (~40 s)
            self._spark_session = spark_session(self.settings(), logger=dg.get_dagster_logger())


def feed_session(resource: Any) -> "SparkSession":
    """The session of the resource a feed's runs use: a `SparkResource`, or a dagster-pyspark resource
    the user passes in (their cluster's Python then needs feedapi-dagster installed, unless it is a
    Spark Connect session, which gets this package as an artifact)."""
    if isinstance(resource, SparkResource):
        return resource.spark_session
    if not isinstance(resource, (LazyPySparkResource, PySparkResource)):
        raise TypeError(f"the Spark resource of feedapi-dagster must be a SparkResource or a dagster-pyspark "
                        f"PySparkResource / LazyPySparkResource, got {type(resource).__name__}")
    session = resource.spark_session
    register_feed_source(session, ship=is_connect(session))
    return session
