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

The attributes are a `ProjectConfig` (the component is one, so `dg check defs` names a misspelt key
with its file and line); `translation` changes the asset specs as in dagster-dlt and dagster-sling
(`key`, `group_name`, `owners`, `tags`, `kinds`, with `{{ feed.name }}` in templates). Each feed's
asset runs the component's `execute`, which a subclass may override (as
`SlingReplicationCollectionComponent.execute`), with the component's `FeedApiResource`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import dagster as dg
from dagster.components.resolved.errors import ResolutionException
from dagster.components.utils.translation import TranslationFn, TranslationFnResolver
from pydantic import BaseModel, SecretStr, ValidationError, field_validator

from feedapi_dagster.spark.settings import SparkSettings

from .assets import LoadEvent
from .config import FeedConfig, ProjectConfig, StorageConfig, checked_feed_name
from .definitions import feed_definitions
from .loads import FeedBinding, LoadConfig
from .resources import FeedApiResource, shared_resource
from .translator import FeedApiTranslator, FeedTranslatorData

log = logging.getLogger(__name__)


class _ComponentTranslator(FeedApiTranslator):
    def __init__(self, translation: TranslationFn[FeedTranslatorData] | None):
        self._translation = translation

    def get_asset_spec(self, data: FeedTranslatorData) -> dg.AssetSpec:
        spec = super().get_asset_spec(data)
        return self._translation(spec, data) if self._translation else spec


def _rendered(context: dg.ResolutionContext, model: BaseModel) -> Mapping[str, Any]:
    """A validated model's values with their `{{ ... }}` templates rendered (the raw YAML was
    validated as written, so that `dg check defs` points at a bad key's line)."""
    values = model.model_dump(exclude_unset=True)
    if isinstance(token := getattr(model, "token", None), SecretStr):
        values["token"] = token.get_secret_value()
    return context.resolve_value(values)


def _resolve_feeds(context: dg.ResolutionContext, feeds: list[FeedConfig]) -> list[FeedConfig]:
    return [_resolve_feed(context.at_path(i), feed) for i, feed in enumerate(feeds)]


def _resolve_feed(context: dg.ResolutionContext, feed: FeedConfig) -> FeedConfig:
    values = dict(_rendered(context, feed))
    if feed.token is not None:
        values["token"] = _token_text(context.at_path("token"), feed, values.get("token"))
    return _validated(context, FeedConfig, values)


# Dagster renders a template natively (jinja2's NativeTemplate): a value that reads as a Python literal
# becomes one, so a token of digits renders as an int, `0x1F` as 31 and `...` as Ellipsis. A token is
# text: it is rendered again behind a character that no Python literal holds, which keeps it as written.
_AS_TEXT = "\x00"
# what a token written as the README once showed it (`ORDERS_FEED_TOKEN=...`) renders to
_PLACEHOLDER = "..."


def _token_text(context: dg.ResolutionContext, feed: FeedConfig, rendered: Any) -> str:
    """The feed's token, rendered as the text it is; an unset variable or a placeholder is refused."""
    assert feed.token is not None
    template = feed.token.get_secret_value()
    variable = _ENV_VARIABLE.search(template)
    if rendered is None or rendered == "":
        # `{{ env.X }}` of a variable that is not set renders to None, which would read the feed
        # without authentication, in silence: a feed that needs none leaves `token` out
        unset = (
            f"the environment variable {variable['name']} is not set (or empty) where the definitions load. "
            f"Set it, or write `token_env: {variable['name']}` to read it in the runs; "
            if variable
            else ""
        )
        raise _reported(
            context,
            f"feed {feed.name!r}: token {template!r} is empty: {unset}a feed that needs no authentication "
            "leaves `token` out",
            inline=f"{variable['name']} is not set" if variable else "empty",
        )
    text = rendered if isinstance(rendered, str) else context.resolve_value(_AS_TEXT + template, as_type=str)[1:]
    if text.strip() == _PLACEHOLDER:
        where = f"set {variable['name']} to the feed's token" if variable else "write the feed's token in its place"
        raise _reported(
            context,
            f"feed {feed.name!r}: token {template!r} is {_PLACEHOLDER!r}, a placeholder: {where}",
            inline="a placeholder",
        )
    return text


_Model = TypeVar("_Model", bound=BaseModel)


def _validated(context: dg.ResolutionContext, model: type[_Model], rendered: Mapping[str, Any]) -> _Model:
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


def _reported(context: dg.ResolutionContext, message: str, inline: str) -> ResolutionException:
    """The error of a value of the defs.yaml, its one plain line also logged as it is raised: Dagster
    reports a code location that does not load with its stack trace first (`dg check defs`, `dg dev`,
    a run), where this line would come twentieth."""
    log.error("%s", message)
    return _yaml_error(context, message, inline)


def _yaml_error(context: dg.ResolutionContext, message: str, inline: str) -> ResolutionException:
    """An error of a value of the defs.yaml, with its file and line (as Dagster reports a template's);
    `inline`: the few words under the value in the snippet."""
    if context.source_position_tree is None:
        return ResolutionException(message)
    source = context.source_position_tree.source_error(
        yaml_path=context.path, inline_error_message=inline, value_error=True
    )
    return ResolutionException(
        f"{source.file_name}:{source.start_line_no} - {source.location}: {message}\n{source.snippet}"
    )


# `translation` as a defs.yaml writes it, and as the component holds it: a function of the asset spec
_TRANSLATION = TranslationFnResolver[FeedTranslatorData](
    lambda data: {"feed": data.feed, "table_path": data.table_path}
)


class FeedApiAttributes(ProjectConfig):
    """The schema of a defs.yaml's `attributes`: the `ProjectConfig` as written (templates not rendered
    yet), without the `| str` Dagster adds to every field of a derived schema (which turns a misspelt
    key deep in a feed into "not valid under any of the given schemas" at `feeds`), so `dg check defs`
    names the key and its line; and `translation`."""

    # dagster builds AssetAttributesModel at import (`AssetSpecUpdateKwargs.model()`): a class that its
    # typing declares as a variable, which mypy refuses in a type
    translation: str | dg.AssetAttributesModel | None = None  # type: ignore[valid-type]


class FeedApiScaffoldParams(BaseModel):
    name: str = "orders"
    url: str = "https://feeds.example.com/orders"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        """A name the component refuses is refused at `dg scaffold`, not at the next `dg check defs`."""
        return checked_feed_name(value)


class FeedApiScaffolder(dg.Scaffolder[FeedApiScaffoldParams]):
    """`dg scaffold defs feedapi_dagster.FeedApiComponent <folder> [--name orders --url https://...]`:
    a defs.yaml with one feed, its token from the environment, the embedded Spark."""

    @classmethod
    def get_scaffold_params(cls) -> type[FeedApiScaffoldParams]:
        return FeedApiScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[FeedApiScaffoldParams]) -> None:
        params = request.params or FeedApiScaffoldParams()
        dg.scaffold_component(
            request,
            {
                "lakehouse": "lakehouse",
                "spark": {"mode": "embedded"},
                "feeds": [
                    {
                        "name": params.name,
                        "url": params.url,
                        "token": f"{{{{ env.{params.name.upper()}_FEED_TOKEN }}}}",
                        "schedule": {"cron": "*/5 * * * *", "enabled": False, "discovery_enabled": False},
                    }
                ],
            },
        )


@dg.scaffold_with(FeedApiScaffolder)
class FeedApiComponent(ProjectConfig, dg.Component, dg.Resolvable):
    """FeedAPI feeds loaded into Delta tables by Spark: per feed an asset partitioned by the feed's
    partitions (with its checks), a discovery sensor, a load schedule and a maintenance schedule. Its
    attributes are the `ProjectConfig`'s (the lakehouse relative to the project root) and `translation`."""

    translation: TranslationFn[FeedTranslatorData] | None = None

    @classmethod
    def get_model_cls(cls) -> type[BaseModel]:
        return FeedApiAttributes

    @classmethod
    def resolve_from_model(cls, context: dg.ResolutionContext, model: BaseModel) -> FeedApiComponent:
        """The component of a defs.yaml's validated attributes, their `{{ ... }}` templates rendered (a
        value rendered wrong is reported at its line). Dagster's resolution walks models of plain fields
        only; these are our pydantic models."""
        assert isinstance(model, FeedApiAttributes)
        storage, spark = context.at_path("storage"), context.at_path("spark")
        return cls(
            lakehouse=context.at_path("lakehouse").resolve_value(model.lakehouse),
            storage=_validated(storage, StorageConfig, _rendered(storage, model.storage)),
            spark=_validated(spark, SparkSettings, _rendered(spark, model.spark)),
            feeds=_resolve_feeds(context.at_path("feeds"), model.feeds),
            translation=None if model.translation is None else _TRANSLATION.execute(context, model, "translation"),
        )

    @property
    def resource(self) -> FeedApiResource:
        """The resource of the feeds' loads: a `SparkResource` of the `spark` settings (one per distinct
        settings in a process, so that the Definitions of two components with the same Spark merge)."""
        return shared_resource(self.spark_settings())

    def execute(
        self, context: dg.AssetExecutionContext, feedapi: FeedApiResource, binding: FeedBinding, config: LoadConfig
    ) -> Iterator[LoadEvent]:
        """What each feed's asset runs: the load of the run's partitions (`FeedApiResource.load`).
        Override it to do more around a load."""
        return feedapi.load(context, binding, config)

    def project_config(self, project_root: Path) -> ProjectConfig:
        """The `ProjectConfig` of the attributes, a relative lakehouse resolved against `project_root`."""
        lakehouse = self.lakehouse
        if "://" not in lakehouse and not Path(lakehouse).is_absolute():
            lakehouse = str((project_root / lakehouse).resolve())
        return ProjectConfig(lakehouse=lakehouse, storage=self.storage, spark=self.spark, feeds=self.feeds)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return feed_definitions(
            self.project_config(context.project_root),
            self.resource,
            _ComponentTranslator(self.translation),
            self.execute,
        )
