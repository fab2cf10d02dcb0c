"""The feeds configuration: what a `FeedApiComponent`'s defs.yaml holds, validated with pydantic
(`dg check defs` reports a bad key with its file and line), or built in Python for
`build_feedapi_definitions`."""
from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from feedapi_dagster.lakehouse.loader import LoadSettings
from feedapi_dagster.lakehouse.maintenance import MaintenanceSettings
from feedapi_dagster.lakehouse.spark import SparkSettings
from feedapi_dagster.lakehouse.datasource import FeedSourceOptions
from feedapi_dagster.protocol import EventFilter, FeedClient, RetryPolicy

_FEED_NAME = re.compile(r"[a-z][a-z0-9_]*")
_TEMPLATE = re.compile(r"\s*\{\{.*\}\}")  # a defs.yaml template, validated once rendered


class ConfigError(ValueError):
    """The feeds configuration is invalid; the message says where."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScheduleConfig(_Strict):
    cron: str = "*/5 * * * *"
    # The demo turns them on; a production code location usually starts them from the UI.
    enabled: bool = False
    discovery_interval_seconds: int = Field(default=60, ge=5)
    discovery_enabled: bool = False
    # After a method-2 split, rebuild the children from `_first` (and drop the vanished parent's
    # rows) instead of continuing them from the parent's cursor.
    rebuild_on_split: bool = False


class FeedConfig(_Strict):
    name: str
    url: str
    dialect: Literal["auto", "v1", "draft", "published"] = "auto"
    partition_count: int | None = Field(default=None, ge=1, le=32768)
    page_size_hint: int = Field(default=1000, ge=1)
    token_env: str | None = Field(default=None, description="environment variable holding the bearer token")
    token: SecretStr | None = Field(default=None, description='the bearer token itself: "{{ env.X }}" in a defs.yaml')
    ca_bundle: str | None = Field(default=None, description="CA bundle file for TLS verification")
    event_id_field: str = "id"
    filters: EventFilter | None = None
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    load: LoadSettings = Field(default_factory=LoadSettings)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    maintenance: MaintenanceSettings = Field(default_factory=MaintenanceSettings)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _FEED_NAME.fullmatch(value):
            raise ValueError(f"feed name must match [a-z][a-z0-9_]* (it names a table and Dagster objects), got {value!r}")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.match(r"https?://[^/]", value) and not _TEMPLATE.match(value):
            raise ValueError("url must be an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _v1_needs_count(self) -> "FeedConfig":
        if self.dialect == "v1" and self.partition_count is None:
            raise ValueError("dialect v1 needs partition_count (v1 has no discovery)")
        if self.token is not None and self.token_env is not None:
            raise ValueError("set token or token_env, not both")
        return self

    def bearer_token(self) -> str | None:
        if self.token is not None:
            return self.token.get_secret_value() or None
        if self.token_env is None:
            return None
        token = os.environ.get(self.token_env)
        if not token:
            raise ConfigError(f"feed {self.name!r}: environment variable {self.token_env} (token_env) is not set")
        return token

    def source(self) -> FeedSourceOptions:
        """The feed as the `feedapi` Spark data source reads it (the token is read from `token_env` here,
        in the run, and handed to the read as a Spark-redacted option)."""
        return FeedSourceOptions(url=self.url, dialect=self.dialect, partition_count=self.partition_count,
                                 page_size_hint=self.page_size_hint, event_id_field=self.event_id_field,
                                 event_filter=self.filters, retry=self.retry, verify=self.ca_bundle or True,
                                 token=self.bearer_token())

    def client(self) -> FeedClient:
        return self.source().client()


class ProjectConfig(_Strict):
    lakehouse: str = "lakehouse"
    spark: SparkSettings = Field(default_factory=SparkSettings)
    feeds: list[FeedConfig]

    @model_validator(mode="after")
    def _unique_names(self) -> "ProjectConfig":
        names = [feed.name for feed in self.feeds]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"feed names must be unique; repeated: {', '.join(duplicates)}")
        return self

    def table_path(self, feed: FeedConfig) -> str:
        return f"{self.lakehouse.rstrip('/')}/{feed.name}"

    def feed(self, name: str) -> FeedConfig:
        return next(feed for feed in self.feeds if feed.name == name)
