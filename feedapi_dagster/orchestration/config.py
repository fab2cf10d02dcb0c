"""The feeds configuration: what a `FeedApiComponent`'s defs.yaml holds, validated with pydantic
(`dg check defs` reports a bad key with its file and line), or built in Python for
`build_feedapi_definitions`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    SecretStr,
    SerializeAsAny,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, InitErrorDetails, PydanticCustomError

from feedapi_dagster.lakehouse.delta_log import Layout
from feedapi_dagster.lakehouse.load_settings import LoadSettings
from feedapi_dagster.lakehouse.maintenance import MaintenanceSettings
from feedapi_dagster.lakehouse.payload_form import DEFAULT_PAYLOAD_FORM, PayloadForm
from feedapi_dagster.planning.column_types import TypeSyntaxError, declared_type
from feedapi_dagster.planning.payload_columns import DEFAULT_EVOLUTION, ColumnsSettings, Evolution
from feedapi_dagster.protocol import FeedClient, FeedSettings, feed_settings, registered_protocols
from feedapi_dagster.protocol.registry import DEFAULT_PROTOCOL
from feedapi_dagster.read.rows import check_id_field
from feedapi_dagster.spark.settings import SparkSettings
from feedapi_dagster.spark.storage import S3Storage, check_storage, is_s3

_FEED_NAME = re.compile(r"[a-z][a-z0-9_]*")


def checked_feed_name(value: str) -> str:
    """`value` where it is a feed's name; a `ValueError` saying the rule (and the name it may mean) otherwise."""
    if not _FEED_NAME.fullmatch(value):
        hint = re.sub(r"[^a-z0-9_]+", "_", value.lower()).strip("_")
        maybe = f" (`{hint}`?)" if _FEED_NAME.fullmatch(hint) else ""
        raise ValueError(
            f"feed name must match [a-z][a-z0-9_]* (it names a table and Dagster objects), got {value!r}{maybe}"
        )
    return value


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
# A token written as a YAML number is refused as written, saying to quote it: YAML reads 12345, and
# 0123 or 0x1F as other numbers, so the text the user meant is gone before any validator sees it
TOKEN_RULE: dict[str, Any] = {
    "if": {"type": ["string", "null"]},
    "else": {"const": "the token in quotes, as text (YAML reads 12345, 0123 or 0x1F as numbers)"},
}
# s3:// and s3n:// are not the file systems Spark has (`check_lakehouse_uri`); s3a:// needs a bucket
LAKEHOUSE_URI_RULE: dict[str, Any] = {"if": {"pattern": "^[sS]3[aAnN]?:"}, "then": {"pattern": "^s3a://[^/]"}}


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
    # What the schedule runs: `batch` loads of the open partitions, or the feed's `stream` job (an
    # availableNow query per tick). Both keep one cursor of record: switching loses and repeats nothing.
    mode: Literal["batch", "stream"] = "batch"
    # A load whose run log has been silent this long is taken for dead (its process is gone: a killed
    # container, a rebooted machine) and marked failed by the feed's stalled-load sensor, which frees
    # its pool slot. A live load logs every 10 s in every phase; the longest quiet moment is the
    # embedded Spark server's start (at most 180 s). 300 s, the sensor's interval and run monitoring's
    # `free_slots_after_run_end_seconds` (30 s, polled every 30 s) free a dead load's slot in ~7 minutes.
    stalled_load_seconds: int = Field(default=300, ge=30)


class PayloadColumnsConfig(_Strict):
    """How a `payload_form: columns` table's typed columns come and change (`planning.payload_columns`)."""

    evolution: Evolution = Field(
        default=DEFAULT_EVOLUTION,
        description="evolve: a new key becomes a column (a new nested key a field) in the commit of the rows "
        "that bring it; rescue: the columns stay as the table's first load made them, new keys go to "
        "`_rescued_data`; freeze: as rescue, but a new key fails the load and commits nothing",
    )
    declared: dict[str, str] = Field(
        default_factory=dict,
        description="payload key -> Spark SQL type (`amount: DECIMAL(12,2)`, `created_at: TIMESTAMP`): the "
        "column's type whatever the events say; a value Spark cannot cast to it is rescued",
    )

    keep_payload: bool = Field(
        default=True,
        description="false: `payload` is NULL where the event is a JSON object Spark parsed (its values are in "
        "the typed columns and `_rescued_data`); strings, numbers, arrays and payloads Spark cannot parse keep "
        "their text. Lost with it: the exact text (number spellings, key order), and keys whose only values "
        "are null, [] or {} (no column holds them)",
    )

    @field_validator("declared")
    @classmethod
    def _types(cls, declared: dict[str, str]) -> dict[str, str]:
        for key, ddl in declared.items():
            try:
                declared_type(ddl)
            except TypeSyntaxError as error:
                raise ValueError(f"payload_columns.declared[{key!r}]: {error}") from None
        return declared

    def settings(self) -> ColumnsSettings:
        return ColumnsSettings(self.evolution, dict(self.declared), self.keep_payload)


class FeedConfig(BaseModel):
    """A feed of the project: how this project loads it (`name`, `schedule`, `load`, `maintenance`)
    and its protocol's settings (where it is, how to read it: `settings`), written flat in a defs.yaml.

    Composition rather than a subclass per protocol: the protocols are open (`register_protocol`), so
    the settings model is known only once the values name their protocol; a FeedConfig class per
    protocol would have to be made at run time for each registered one. The flat shape is kept by a
    before-validator (the keys that are not the project's go to the registry, `feed_settings`), a
    serializer (back out, flat) and a JSON schema built from the registry (so `dg check defs` names a
    misspelt key of any registered protocol with its line)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(json_schema_extra=FEED_NAME_RULE)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    load: LoadSettings = Field(default_factory=LoadSettings)
    maintenance: MaintenanceSettings = Field(default_factory=MaintenanceSettings)
    layout: Layout | None = Field(
        default=None,
        description="how the feed's table lays out its rows by partition: clustered (liquid clustering; "
        "delta-rs cannot write it), partitioned (a folder per partition) or none; null: clustered for a "
        "new table, an existing one as it is. An existing table's layout never changes: a table found "
        "with another layout fails the load",
    )
    payload_form: PayloadForm = Field(
        default=DEFAULT_PAYLOAD_FORM,
        description="the payload's form in the table: json (the event's JSON text in `payload`), variant "
        "(also the payload parsed, in a column `data VARIANT`: `data:amount::int`) or columns (also the "
        "payload's top-level keys as typed columns, inferred and evolving as `payload_columns` says, what "
        "does not fit in `_rescued_data`). A json table switched to variant or columns gets the form's "
        "column in place (older rows NULL); a variant or columns table is loaded in no other form",
    )
    payload_columns: PayloadColumnsConfig = Field(default_factory=PayloadColumnsConfig)
    # as its protocol's model, not the base's fields only (the model is the registered protocol's)
    settings: SerializeAsAny[FeedSettings]

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or "settings" in data:
            return data
        own = {key: value for key, value in data.items() if key in _PROJECT_KEYS}
        settings = feed_settings({key: value for key, value in data.items() if key not in _PROJECT_KEYS})
        if not re.match(r"https?://[^/]", settings.url) and not _TEMPLATE.match(settings.url):
            raise _invalid("url", settings.url, "url must be an http:// or https:// URL")
        try:
            check_id_field(settings.event_id_field)
        except ValueError as error:
            raise _invalid("event_id_field", settings.event_id_field, str(error)) from None
        return {**own, "settings": settings}

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return checked_feed_name(value)

    @model_serializer(mode="wrap")
    def _flat_dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        values = handler(self)
        return {**values.pop("settings"), **values}

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        """The flat shape: the project's keys, and those of the protocol `protocol` names (FeedAPI's
        when absent), no other, for each registered protocol."""
        schema = dict(handler.resolve_ref_schema(handler(core_schema)))
        own = {key: value for key, value in schema["properties"].items() if key != "settings"}
        protocols = registered_protocols()
        cases = []
        for name, protocol in sorted(protocols.items()):
            settings = handler.resolve_ref_schema(handler(protocol.settings.__pydantic_core_schema__))
            properties = {**settings["properties"], **own}
            properties["url"] = {**properties["url"], **URL_RULE}
            token = {key: value for key, value in properties["token"].items() if key != "anyOf"}
            properties["token"] = {**token, **TOKEN_RULE}
            chosen: dict[str, Any] = {"properties": {"protocol": {"const": name}}}
            if name != DEFAULT_PROTOCOL:
                chosen["required"] = ["protocol"]
            cases.append(
                {
                    "if": chosen,
                    "then": {
                        "properties": properties,
                        "additionalProperties": False,
                        "required": sorted({"name", *settings.get("required", [])}),
                    },
                }
            )
        # the keys are checked in the one case that applies, so that a wrong value is reported once
        return {
            "title": schema.get("title", cls.__name__),
            "description": schema.get("description", ""),
            "type": "object",
            "properties": {"protocol": {"enum": sorted(protocols)}},
            "allOf": cases,
        }

    @property
    def url(self) -> str:
        return self.settings.url

    @property
    def protocol(self) -> str:
        return self.settings.protocol

    @property
    def token(self) -> SecretStr | None:
        return self.settings.token

    def describe(self) -> str:
        return f"feed {self.name!r}"

    def bearer_token(self) -> str | None:
        return self.settings.bearer_token(self.describe())

    def client(self) -> FeedClient:
        return FeedClient(self.settings, label=self.describe())


_PROJECT_KEYS = frozenset(FeedConfig.model_fields) - {"settings"}


def _invalid(key: str, value: Any, message: str) -> ValidationError:
    """A feed's error at `key` of its flat shape (a defs.yaml's line)."""
    return ValidationError.from_exception_data(
        FeedConfig.__name__,
        [InitErrorDetails(type=PydanticCustomError("value_error", message), loc=(key,), input=value)],
    )


class StorageConfig(_Strict):
    """Where the lakehouse is stored, beyond its URI: one block per kind of object storage."""

    s3: S3Storage | None = Field(default=None, description="an s3a:// lakehouse: endpoint, region, credentials")


class ProjectConfig(_Strict):
    """The feeds of a project and where they are loaded: what `build_feedapi_definitions` takes, and
    the attributes of a `FeedApiComponent`'s defs.yaml (with `translation`)."""

    lakehouse: str = Field(
        default="lakehouse",
        json_schema_extra=LAKEHOUSE_URI_RULE,
        description="Folder or URI of the tables (relative: to the project root).",
    )
    storage: StorageConfig = Field(
        default_factory=StorageConfig, description="The lakehouse's object storage: s3 (endpoint, region, credentials)."
    )
    spark: SparkSettings = Field(
        default_factory=SparkSettings, description="Where Spark runs: embedded (default), remote (sc://...) or local."
    )
    feeds: list[FeedConfig] = Field(description="The feeds: one Delta table and one asset each.")

    @model_validator(mode="after")
    def _storage(self) -> ProjectConfig:
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
    def _unique_names(self) -> ProjectConfig:
        names = [feed.name for feed in self.feeds]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"feed names must be unique; repeated: {', '.join(duplicates)}")
        return self

    def table_path(self, feed: FeedConfig) -> str:
        return f"{self.lakehouse.rstrip('/')}/{feed.name}"

    def feed(self, name: str) -> FeedConfig:
        return next(feed for feed in self.feeds if feed.name == name)
