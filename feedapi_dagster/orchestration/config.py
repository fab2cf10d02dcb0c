"""The feeds configuration file (YAML), validated with pydantic.

Errors name the file and the offending key (`feeds[1].name: ...`), so a typo is found without
reading a traceback.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from feedapi_dagster.lakehouse.loader import LoadSettings
from feedapi_dagster.lakehouse.sink import CompactionSettings
from feedapi_dagster.lakehouse.spark import SparkSettings
from feedapi_dagster.lakehouse.datasource import FeedSourceOptions
from feedapi_dagster.protocol import EventFilter, FeedClient, RetryPolicy

CONFIG_ENV = "FEEDAPI_DAGSTER_CONFIG"
LAKEHOUSE_ENV = "FEEDAPI_LAKEHOUSE"
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "dagster_project" / "feeds.yaml"
_FEED_NAME = re.compile(r"[a-z][a-z0-9_]*")


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
    ca_bundle: str | None = Field(default=None, description="CA bundle file for TLS verification")
    event_id_field: str = "id"
    filters: EventFilter | None = None
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    load: LoadSettings = Field(default_factory=LoadSettings)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    compaction: CompactionSettings = Field(default_factory=CompactionSettings)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _FEED_NAME.fullmatch(value):
            raise ValueError(f"feed name must match [a-z][a-z0-9_]* (it names a table and Dagster objects), got {value!r}")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.match(r"https?://[^/]", value):
            raise ValueError("url must be an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _v1_needs_count(self) -> "FeedConfig":
        if self.dialect == "v1" and self.partition_count is None:
            raise ValueError("dialect v1 needs partition_count (v1 has no discovery)")
        return self

    def token(self) -> str | None:
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
                                 token=self.token())

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


def load_config(path: str | Path | None = None) -> ProjectConfig:
    """Read and validate the feeds file (`FEEDAPI_DAGSTER_CONFIG`, else `dagster_project/feeds.yaml`).

    A relative `lakehouse` is resolved against the file's folder; `FEEDAPI_LAKEHOUSE` overrides it.
    """
    path = Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the feeds configuration: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from error
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a mapping with `lakehouse`, `spark` and `feeds`")
    try:
        config = ProjectConfig.model_validate(document)
    except ValidationError as error:
        raise ConfigError(f"{path}: invalid feeds configuration:\n{_describe(error)}") from None
    lakehouse = os.environ.get(LAKEHOUSE_ENV) or config.lakehouse
    if "://" not in lakehouse and not Path(lakehouse).is_absolute():
        lakehouse = str((path.parent / lakehouse).resolve())
    return config.model_copy(update={"lakehouse": lakehouse})


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        location = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in item["loc"]).lstrip(".")
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (check its spelling)"
        lines.append(f"  {location or '<root>'}: {message}")
    return "\n".join(lines)
