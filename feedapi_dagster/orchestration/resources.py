"""Dagster resources."""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import dagster as dg
from pydantic import PrivateAttr

from feedapi_dagster.lakehouse.spark import DEFAULT_PORT, SparkSettings, spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SparkResource(dg.ConfigurableResource):
    """One Spark session per run process, shared by every partition the run loads.

    `embedded` (default) connects to the project's local Spark Connect server (started on first use
    and left running, so later runs only pay a ~1.5 s client); `remote` connects to a cluster's
    Spark Connect URL; `local` runs Spark inside the run process (tests).
    """

    mode: Literal["embedded", "remote", "local"] = "embedded"
    remote: str | None = None
    port: int = DEFAULT_PORT
    conf: dict[str, str] = {}

    _session: "SparkSession | None" = PrivateAttr(default=None)

    @classmethod
    def from_settings(cls, settings: SparkSettings) -> "SparkResource":
        return cls(mode=settings.mode, remote=settings.remote, port=settings.port, conf=settings.conf)

    def session(self) -> "SparkSession":
        if self._session is None:
            settings = SparkSettings(mode=self.mode, remote=self.remote, port=self.port, conf=self.conf,
                                     detach_server=True)
            self._session = spark_session(settings)
        return self._session
