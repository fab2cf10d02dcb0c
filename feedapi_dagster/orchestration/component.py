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

import re
from pathlib import Path
from typing import Annotated, Any, TypeVar

import dagster as dg
from dagster.components.resolved.errors import ResolutionException
from dagster.components.utils.translation import TranslationFn, TranslationFnResolver
from pydantic import BaseModel, Field, SecretStr, ValidationError, model_validator

from feedapi_dagster.lakehouse.spark_conf import SparkSettings
from feedapi_dagster.lakehouse.storage import check_storage

from .config import LAKEHOUSE_URI_RULE, FeedConfig, ProjectConfig, StorageConfig
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
    return [_resolve_feed(context.at_path(i), feed) for i, feed in enumerate(feeds)]


def _resolve_feed(context: dg.ResolutionContext, feed: FeedConfig) -> FeedConfig:
    values = _rendered(context, feed)
    if feed.token is not None and not values.get("token"):
        # `{{ env.X }}` of a variable that is not set renders to None, which would read the feed
        # without authentication, in silence: a feed that needs none leaves `token` out
        template = feed.token.get_secret_value()
        variable = _ENV_VARIABLE.search(template)
        unset = (f"the environment variable {variable['name']} is not set (or empty) where the definitions load. "
                 f"Set it, or write `token_env: {variable['name']}` to read it in the runs; " if variable else "")
        raise _yaml_error(context.at_path("token"), f"feed {values.get('name')!r}: token {template!r} is empty: "
                                                    f"{unset}a feed that needs no authentication leaves `token` out",
                          inline=f"{variable['name']} is not set" if variable else "empty")
    return _validated(context, FeedConfig, values)


_Model = TypeVar("_Model", bound=BaseModel)


def _validated(context: dg.ResolutionContext, model: type[_Model], rendered: dict[str, Any]) -> _Model:
    """The model of the rendered values; a value a template rendered wrong is reported at its line
    without pydantic's wrapping (input values, links)."""
    try:
        return model.model_validate(rendered)
    except ValidationError as invalid:
        first = invalid.errors()[0]
        at = context
        for part in first["loc"]:
            at = at.at_path(part)
        message = first["msg"].removeprefix("Value error, ")
        raise _yaml_error(at, message, inline=message) from None


_ENV_VARIABLE = re.compile(r"""env(?:\.|\(\s*["'])(?P<name>\w+)""")  # {{ env.X }}, {{ env('X', ...) }}


def _yaml_error(context: dg.ResolutionContext, message: str, inline: str) -> ResolutionException:
    """An error of a value of the defs.yaml, with its file and line (as Dagster reports a template's);
    `inline`: the few words under the value in the snippet."""
    if context.source_position_tree is None:
        return ResolutionException(message)
    source = context.source_position_tree.source_error(yaml_path=context.path, inline_error_message=inline,
                                                       value_error=True)
    return ResolutionException(f"{source.file_name}:{source.start_line_no} - {source.location}: {message}\n"
                               f"{source.snippet}")


def _resolve_storage(context: dg.ResolutionContext, storage: StorageConfig) -> StorageConfig:
    return _validated(context, StorageConfig, _rendered(context, storage))


def _resolve_spark(context: dg.ResolutionContext, spark: SparkSettings) -> SparkSettings:
    return _validated(context, SparkSettings, _rendered(context, spark))


class FeedApiAttributes(dg.Model):
    """The schema of a defs.yaml's `attributes`: our models as they are, without the `| str` Dagster
    adds to every field of a derived schema (which turns a misspelt key deep in a feed into
    "not valid under any of the given schemas" at `feeds`), so `dg check defs` names the key and its line."""

    feeds: list[FeedConfig]
    lakehouse: str = Field(default="lakehouse", json_schema_extra=LAKEHOUSE_URI_RULE)
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
