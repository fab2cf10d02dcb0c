"""The feeds configuration: what a `FeedApiComponent`'s defs.yaml holds, validated with pydantic
(`dg check defs` reports a bad key with its file and line), or built in Python for
`build_feedapi_definitions`."""
from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from feedapi_dagster.lakehouse.loader import LoadSettings
from feedapi_dagster.lakehouse.maintenance import MaintenanceSettings
from feedapi_dagster.lakehouse.spark_conf import SparkSettings
from feedapi_dagster.lakehouse.storage import S3Storage, check_storage, is_s3
from feedapi_dagster.lakehouse.table import check_id_field
from feedapi_dagster.protocol import Feed, FeedClient

_FEED_NAME = re.compile(r"[a-z][a-z0-9_]*")
_TEMPLATE = re.compile(r"\s*\{\{.*\}\}")  # a defs.yaml template, validated once rendered


# Rules of the component's JSON schema, which `dg check defs` applies to a defs.yaml as written before it
# loads anything: a value that breaks one is reported as a misspelt key is, in one line with its file
# and line ("'Orders' does not match '^[a-z][a-z0-9_]*$'"), where the validators' errors come at load
# time inside a stack trace. The validators stay the rule (for templates, once rendered, and Python).
def _literal_rule(pattern: str) -> dict[str, Any]:
    """`pattern` for a value written as it is (a `{{ ... }}` template is checked once rendered)."""
    return {"if": {"not": {"pattern": r"\{\{"}}, "then": {"pattern": pattern}}


FEED_NAME_RULE = _literal_rule(f"^{_FEED_NAME.pattern}$")
URL_RULE = _literal_rule("^https?://[^/]")
# s3:// and s3n:// are not the file systems Spark has (`check_lakehouse_uri`); s3a:// needs a bucket
LAKEHOUSE_URI_RULE = {"if": {"pattern": "^[sS]3[aAnN]?:"}, "then": {"pattern": "^s3a://[^/]"}}


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


class FeedConfig(Feed):
    """A feed of the project: the `Feed` (where it is, how to read it) and how this project loads it."""

    name: str = Field(json_schema_extra=FEED_NAME_RULE)
    url: str = Field(json_schema_extra=URL_RULE)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    load: LoadSettings = Field(default_factory=LoadSettings)
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

    @field_validator("event_id_field")
    @classmethod
    def _id_field(cls, value: str) -> str:
        return check_id_field(value)

    def describe(self) -> str:
        return f"feed {self.name!r}"

    def client(self) -> FeedClient:
        return FeedClient(self)


class StorageConfig(_Strict):
    """Where the lakehouse is stored, beyond its URI: one block per kind of object storage."""

    s3: S3Storage | None = Field(default=None, description="an s3a:// lakehouse: endpoint, region, credentials")


class ProjectConfig(_Strict):
    """The feeds of a project and where they are loaded: what `build_feedapi_definitions` takes, and
    the attributes of a `FeedApiComponent`'s defs.yaml (with `translation`)."""

    lakehouse: str = Field(default="lakehouse", json_schema_extra=LAKEHOUSE_URI_RULE,
                           description="Folder or URI of the tables (relative: to the project root).")
    storage: StorageConfig = Field(default_factory=StorageConfig,
                                   description="The lakehouse's object storage: s3 (endpoint, region, credentials).")
    spark: SparkSettings = Field(default_factory=SparkSettings,
                                 description="Where Spark runs: embedded (default), remote (sc://...) or local.")
    feeds: list[FeedConfig] = Field(description="The feeds: one Delta table and one asset each.")

    @model_validator(mode="after")
    def _storage(self) -> "ProjectConfig":
        if self.spark.s3 is not None:
            raise ValueError("spark.s3 is set from storage.s3 (the lakehouse's storage): set that instead")
        check_storage(self.lakehouse, self.storage.s3, self.spark.mode, self.spark.conf)
        return self

    @property
    def s3(self) -> S3Storage | None:
        """The S3 settings of an s3a:// lakehouse (AWS's defaults when the storage block has none)."""
        return (self.storage.s3 or S3Storage()) if is_s3(self.lakehouse) else None

    def spark_settings(self) -> SparkSettings:
        """The `spark` settings with the lakehouse's S3 storage in them (`SparkSettings.s3`): every
        session made from them gets its s3a settings and credentials (read when the session is made)
        as runtime settings; the settings in `spark.conf` win. Credentials are named by variables, never
        in `conf`."""
        return self.spark.model_copy(update={"s3": self.s3})

    def storage_options(self) -> dict[str, str]:
        """delta-rs's options for the lakehouse's tables (credentials read here)."""
        return self.s3.storage_options() if self.s3 is not None else {}

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
