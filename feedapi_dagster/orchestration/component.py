"""`FeedApiComponent`: feeds declared in a `defs.yaml` of a `dg` project.

    type: feedapi_dagster.FeedApiComponent
    attributes:
      lakehouse: lakehouse            # relative to the project root, or s3a://bucket/prefix
      storage: {s3: {region: eu-west-1}}   # an s3a:// lakehouse's endpoint, region, credentials
      spark: {mode: embedded}
      feeds:
        - name: orders
          url: https://feeds.example.com/orders
          token: "{{ env.ORDERS_TOKEN }}"

The attributes are the `ProjectConfig` (validated by the same models, so `dg check defs` names a
misspelt key with its file and line); `translation` changes the asset specs as in dagster-dlt and
dagster-sling (`key`, `group_name`, `owners`, `tags`, `kinds`, with `{{ feed.name }}` in templates).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import dagster as dg
from dagster.components.utils.translation import TranslationFn, TranslationFnResolver
from pydantic import BaseModel, Field, SecretStr, model_validator

from feedapi_dagster.lakehouse.spark_conf import SparkSettings
from feedapi_dagster.lakehouse.storage import check_storage

from .config import FeedConfig, ProjectConfig, StorageConfig
from .definitions import SPARK_RESOURCE_KEY, build_feedapi_definitions
from .translator import FeedApiTranslator, FeedTranslatorData


class _ComponentTranslator(FeedApiTranslator):
    def __init__(self, translation: TranslationFn[FeedTranslatorData] | None):
        self._translation = translation

    def get_asset_spec(self, data: FeedTranslatorData) -> dg.AssetSpec:
        spec = super().get_asset_spec(data)
        return self._translation(spec, data) if self._translation else spec


def _rendered(context: dg.ResolutionContext, model: BaseModel) -> dict[str, Any]:
    """A validated model's values with their `{{ ... }}` templates rendered (the raw YAML was
    validated as written, so that `dg check defs` points at a bad key's line)."""
    values = model.model_dump(exclude_unset=True)
    if isinstance(getattr(model, "token", None), SecretStr):
        values["token"] = model.token.get_secret_value()
    return context.resolve_value(values)


def _resolve_feeds(context: dg.ResolutionContext, feeds: list[FeedConfig]) -> list[FeedConfig]:
    return [FeedConfig.model_validate(_rendered(context.at_path(i), feed)) for i, feed in enumerate(feeds)]


def _resolve_storage(context: dg.ResolutionContext, storage: StorageConfig) -> StorageConfig:
    return StorageConfig.model_validate(_rendered(context, storage))


def _resolve_spark(context: dg.ResolutionContext, spark: SparkSettings) -> SparkSettings:
    return SparkSettings.model_validate(_rendered(context, spark))


class FeedApiAttributes(dg.Model):
    """The schema of a defs.yaml's `attributes`: our models as they are, without the `| str` Dagster
    adds to every field of a derived schema (which turns a misspelt key deep in a feed into
    "not valid under any of the given schemas" at `feeds`), so `dg check defs` names the key and its line."""

    feeds: list[FeedConfig]
    lakehouse: str = "lakehouse"
    storage: StorageConfig = Field(default_factory=StorageConfig)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    spark_resource_key: str = SPARK_RESOURCE_KEY
    translation: str | dg.AssetAttributesModel | None = None

    @model_validator(mode="after")
    def _storage(self) -> "FeedApiAttributes":
        # ProjectConfig checks the same; here `dg check defs` reports it against the defs.yaml
        check_storage(self.lakehouse, self.storage.s3, self.spark.mode, self.spark.conf)
        return self


class FeedApiScaffoldParams(BaseModel):
    name: str = "orders"
    url: str = "https://feeds.example.com/orders"


class FeedApiScaffolder(dg.Scaffolder[FeedApiScaffoldParams]):
    """`dg scaffold defs feedapi_dagster.FeedApiComponent <folder> [--name orders --url https://...]`:
    a defs.yaml with one feed, its token from the environment, the embedded Spark."""

    @classmethod
    def get_scaffold_params(cls) -> type[FeedApiScaffoldParams]:
        return FeedApiScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[FeedApiScaffoldParams]) -> None:
        params = request.params or FeedApiScaffoldParams()
        dg.scaffold_component(request, {
            "lakehouse": "lakehouse",
            "spark": {"mode": "embedded"},
            "feeds": [{
                "name": params.name,
                "url": params.url,
                "token": f"{{{{ env.{params.name.upper()}_FEED_TOKEN }}}}",
                "schedule": {"cron": "*/5 * * * *", "enabled": False, "discovery_enabled": False},
            }],
        })


@dg.scaffold_with(FeedApiScaffolder)
class FeedApiComponent(dg.Component, dg.Model, dg.Resolvable):
    """FeedAPI feeds loaded into Delta tables by Spark: per feed an asset partitioned by the feed's
    partitions (with its checks), a discovery sensor, a load schedule and a maintenance schedule."""

    # (the Python types are loose on purpose: Dagster's resolution only walks models of plain fields;
    # the YAML is validated against the model_field_type, our pydantic models)
    feeds: Annotated[list, dg.Resolver(_resolve_feeds, model_field_type=list[FeedConfig])] = Field(
        description="The feeds: one Delta table and one asset each.")
    lakehouse: str = Field(default="lakehouse",
                           description="Folder or URI of the tables (relative: to the project root).")
    storage: Annotated[Any, dg.Resolver(_resolve_storage, model_field_type=StorageConfig)] = Field(
        default_factory=StorageConfig, description="The lakehouse's object storage: s3 (endpoint, region, credentials).")
    spark: Annotated[Any, dg.Resolver(_resolve_spark, model_field_type=SparkSettings)] = Field(
        default_factory=SparkSettings, description="Where Spark runs: embedded (default), remote (sc://...) or local.")
    spark_resource_key: str = Field(default=SPARK_RESOURCE_KEY,
                                    description="Resource key of the Spark resource the loads use.")
    translation: Annotated[
        TranslationFn[FeedTranslatorData] | None,
        TranslationFnResolver[FeedTranslatorData](lambda data: {"feed": data.feed, "table_path": data.table_path}),
    ] = None

    @classmethod
    def get_model_cls(cls) -> type[BaseModel]:
        return FeedApiAttributes

    def project_config(self, project_root: Path) -> ProjectConfig:
        lakehouse = self.lakehouse
        if "://" not in lakehouse and not Path(lakehouse).is_absolute():
            lakehouse = str((project_root / lakehouse).resolve())
        return ProjectConfig(lakehouse=lakehouse, storage=self.storage, spark=self.spark, feeds=self.feeds)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return build_feedapi_definitions(self.project_config(context.project_root),
                                         translator=_ComponentTranslator(self.translation),
                                         spark_resource_key=self.spark_resource_key)
