"""How a feed looks in Dagster: its asset key, group, owners, tags, kinds and definition metadata.

Subclass `FeedApiTranslator` (as `DagsterDltTranslator`) and override `get_asset_spec` to change them;
the factory and the Component build every feed's asset from the spec it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from feedapi_dagster.lakehouse.payload_form import DATA_COLUMN, DEFAULT_PAYLOAD_FORM, PayloadForm
from feedapi_dagster.planning.payload_columns import RESCUE_COLUMN, PayloadColumn
from feedapi_dagster.read.rows import TABLE_SCHEMA

from .config import FeedConfig

_DAGSTER_TYPES = {"int32": "int", "int64": "bigint", "string": "string", "timestamp[us, tz=UTC]": "timestamp"}
_COLUMN_DESCRIPTIONS = {
    "partition_id": "the feed's partition (the Delta partition column, and the asset's partition key)",
    "position": "0-based position of the event in its partition",
    "cursor": "cursor of the page that delivered the event",
    "payload": "the event as the feed sent it (JSON object bytes or the string; NULL for an object in typed "
    "columns where `payload_columns.keep_payload` is false)",
    "payload_type": "object | string",
    "event_id": "the configured id field of an object payload",
    "loaded_at": "when the commit that wrote the row happened",
    "run_id": "the Dagster run that wrote the row",
}
_DATA_COLUMN = dg.TableColumn(
    DATA_COLUMN,
    "variant",
    description="the payload parsed (payload_form: variant; `data:field::type`); NULL where Spark could not "
    "parse it, and in rows loaded before the column was added",
)


@dataclass(frozen=True)
class FeedTranslatorData:
    """What the translator sees of a feed."""

    feed: FeedConfig
    table_path: str

    @property
    def table_uri(self) -> str:
        return self.table_path if "://" in self.table_path else Path(self.table_path).resolve().as_uri()


_RESCUED_COLUMN = dg.TableColumn(
    RESCUE_COLUMN,
    "string",
    description="the payload's values that have no column or do not fit theirs, as a JSON object under their "
    "keys (payload_form: columns); NULL where every value landed in its column",
)


def table_column_schema(
    payload_form: PayloadForm = DEFAULT_PAYLOAD_FORM, payload_columns: Sequence[PayloadColumn] = ()
) -> dg.TableSchema:
    """The table's columns for the feed's payload form (what `FeedTable.ensure_table` makes of it), with
    a columns table's typed `payload_columns` (as a write found or made them)."""
    columns = [
        dg.TableColumn(field.name, _DAGSTER_TYPES[str(field.type)], description=_COLUMN_DESCRIPTIONS[field.name])
        for field in TABLE_SCHEMA
    ]
    if payload_form == "variant":
        columns.append(_DATA_COLUMN)
    elif payload_form == "columns":
        columns.append(_RESCUED_COLUMN)
        columns.extend(
            dg.TableColumn(
                column.name,
                column.type.ddl().lower(),
                description=f"the payload's key {column.key!r}" + (", declared" if column.declared else ", inferred"),
            )
            for column in payload_columns
        )
    return dg.TableSchema(columns=columns)


class FeedApiTranslator:
    """The default asset spec of a feed: key `feedapi/<name>`, group `feedapi`, kinds delta and spark,
    and the table's name, URI and column schema as Dagster's standard metadata."""

    def get_asset_spec(self, data: FeedTranslatorData) -> dg.AssetSpec:
        feed = data.feed
        return dg.AssetSpec(
            key=dg.AssetKey(["feedapi", feed.name]),
            group_name="feedapi",
            kinds={"delta", "spark"},
            description=f"Feed `{feed.name}` ({feed.protocol}, {feed.settings.location()}) in the Delta table "
            f"`{data.table_path}`, partitioned by the feed's partition.",
            metadata={
                "dagster/table_name": data.table_path,
                "dagster/column_schema": table_column_schema(feed.payload_form),
                "dagster/uri": dg.MetadataValue.url(data.table_uri),
            },
        )
