"""The typed columns of a `payload_form: columns` table, planned for one write: pure (no Spark).

Spark tells what the write's payloads hold, as a list of `Shape`s: each top-level key of the object
payloads, with the type Spark's `schema_of_variant` gives its value (`BIGINT`, `OBJECT<a: STRING>`...),
how many rows have it and the first partition that does. `plan_columns` decides, from these and the
table's payload columns as they are, what the write does:

* **types** (`column_types.py`): integers are `BIGINT`, other numbers `DOUBLE` (a load that sees both makes
  `DOUBLE`; integers beyond `BIGINT` `DECIMAL(38,0)`, numbers with more digits than a double holds
  exactly `VARIANT`), `BOOLEAN`, `STRING` (timestamps too, unless declared), objects `STRUCT`, arrays `ARRAY`; a
  key whose values have no common type in one write (a number and a string) gets a `VARIANT` column.
  A value that is only ever `null`, `[]` or `{}` says no type: no column (no field) until one does, and
  until then it reads as NULL there (`payload` keeps it).
* **evolution** (`Evolution`): `evolve` adds a new key as a column, and a new nested key as a field of
  its struct, in the write's own commit; `rescue` and `freeze` change nothing once the table has payload
  columns (a table's first payload columns come from its first load, as Auto Loader's `rescue` does):
  `freeze` then fails the write over a new key, naming it and a partition that holds it.
* **fit**: a column's type never changes (Delta's type widening would make delta-rs 1.6 unable to read
  the table: measured). A value fits its column when its shape does exactly (`misfit`): an integer fits
  `DOUBLE`, a number does not fit `BIGINT`, a string fits no number. A value that does not fit, and a
  key that has no column, are **rescued**: the row's `_rescued_data` holds them as a JSON object under
  their own key. Nothing is cast that would change it (Spark's casts turn `1.5` into `1`, `"12"` into
  12), and nothing is dropped.
* **names** (`column_name`): a key is its column's name where Delta and Spark take it as it is. Else
  the characters Delta refuses (` ,;{}()\\n\\t=`) become `_`, an empty key `_`, and a name taken by one of
  the table's own columns or another key's column (Spark compares names ignoring case) gets `_1`,
  `_2`... (of two new keys of one load, the one more rows have keeps the name). The column's field
  metadata keeps its key (`KEY_METADATA`), so a mapping, once made, lasts.
  Nested keys are not renamed: an object whose keys Delta cannot take as field names is rescued whole.
* **declared** columns (a feed's `payload_columns.declared`, a Nakadi event type's JSON Schema) win
  over inference: their type is used as it is, and a top-level scalar value is cast to it (a value Spark
  cannot cast is rescued; a nested value is never cast, so it must fit as an inferred one does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from feedapi_dagster.errors import PayloadSchemaFrozen

from .column_types import (
    INVALID_NAME,
    VARIANT,
    VOID,
    Array,
    ColumnType,
    Struct,
    declared_type,
    evolve,
    misfit,
    parse_type,
    shape_type,
    type_of_json,
    unify,
    untyped,
)

Evolution = Literal["evolve", "rescue", "freeze"]
DEFAULT_EVOLUTION: Evolution = "evolve"
RESCUE_COLUMN = "_rescued_data"
# a payload column's field metadata: the payload key it holds
KEY_METADATA = "feedapi.key"
DECLARED_METADATA = "feedapi.declared"


@dataclass(frozen=True)
class Shape:
    """One top-level key of a write's object payloads with one shape of its value, as Spark counted."""

    key: str
    shape: str  # `schema_of_variant` of the value
    rows: int
    partition: int  # the first partition that has it


@dataclass(frozen=True)
class PayloadColumn:
    """A typed column of the table: the payload key it holds, its name, its type."""

    key: str
    name: str
    type: ColumnType
    declared: bool = False


@dataclass(frozen=True)
class KeyPlan:
    """How one key of the write's payloads lands: in `column` where its shape is not one of `misfits`
    (those values are rescued), cast and checked where the column is declared; with no column, every
    value it has is rescued."""

    key: str
    column: PayloadColumn | None
    misfits: tuple[str, ...] = ()
    cast_checked: bool = False

    @property
    def rescues(self) -> bool:
        return self.column is None or bool(self.misfits) or self.cast_checked


@dataclass(frozen=True)
class ColumnsPlan:
    """The table's payload columns after the write (`columns`), those it adds (`added`) or gives new nested
    fields (`extended`), and how each key of its payloads lands (`keys`)."""

    columns: tuple[PayloadColumn, ...]
    added: tuple[PayloadColumn, ...] = ()
    extended: tuple[PayloadColumn, ...] = ()
    keys: tuple[KeyPlan, ...] = ()

    @property
    def changes_schema(self) -> bool:
        return bool(self.added or self.extended)


@dataclass(frozen=True)
class ColumnsSettings:
    evolution: Evolution = DEFAULT_EVOLUTION
    declared: Mapping[str, str] = field(default_factory=dict)  # key -> Spark DDL type
    # False: an object payload Spark parsed is not kept as text (`payload` NULL), its values being in the
    # typed columns and `_rescued_data`; other payloads (strings, numbers, unparsed) keep their text
    keep_payload: bool = True

    def with_server_declared(self, server: Mapping[str, str]) -> ColumnsSettings:
        """These settings with the types the feed's server declares (a Nakadi event type's JSON Schema):
        the feed's own declarations win."""
        return ColumnsSettings(self.evolution, {**server, **self.declared}, self.keep_payload)


def column_name(key: str, taken: Iterable[str]) -> str:
    """The column a new key gets (see the module docstring), given the names `taken` already."""
    taken_lower = {name.lower() for name in taken}
    base = INVALID_NAME.sub("_", key) or "_"
    name, suffix = base, 0
    while name.lower() in taken_lower:
        suffix += 1
        name = f"{base}_{suffix}"
    return name


def plan_columns(
    existing: Iterable[PayloadColumn],
    shapes: Iterable[Shape],
    settings: ColumnsSettings,
    reserved: Iterable[str],
) -> ColumnsPlan:
    """The plan of a write whose payloads have `shapes`, into a table with payload columns `existing` and
    its own columns `reserved`. `PayloadSchemaFrozen` where `settings` freeze the schema and a key is new."""
    columns = {column.key: column for column in existing}
    by_key: dict[str, list[Shape]] = {}
    for shape in shapes:
        by_key.setdefault(shape.key, []).append(shape)
    parsed = {shape.shape: parse_type(shape.shape) for found in by_key.values() for shape in found}
    # a table's first payload columns come from its first load, whatever the mode
    evolving = settings.evolution == "evolve" or not columns
    taken = [*reserved, *(column.name for column in columns.values())]
    added: list[PayloadColumn] = []
    extended: list[PayloadColumn] = []

    def add(column: PayloadColumn) -> None:
        columns[column.key] = column
        taken.append(column.name)
        added.append(column)

    for key, ddl in sorted(settings.declared.items()):
        if key not in columns:  # a declaration is a schema change the user asks for
            add(PayloadColumn(key, column_name(key, taken), declared_type(ddl), declared=True))
    # of two new keys Spark takes for one name, the one more rows have gets it (then: in sort order)
    for key in sorted(by_key, key=lambda k: (-sum(shape.rows for shape in by_key[k]), k)):
        values = _values_type(by_key[key], parsed)
        column = columns.get(key)
        if column is None:
            if untyped(values):
                continue
            if evolving:
                add(PayloadColumn(key, column_name(key, taken), values))
            elif settings.evolution == "freeze":
                _frozen(key, by_key[key], "a new key")
        elif evolving and not column.declared and (grown := evolve(column.type, values)) != column.type:
            columns[key] = PayloadColumn(key, column.name, grown)
            extended.append(columns[key])
    keys = []
    for key in sorted(by_key):
        column = columns.get(key)
        if column is None:
            if not all(untyped(parsed[shape.shape]) for shape in by_key[key]):
                keys.append(KeyPlan(key, None))
            continue
        misfits = []
        for shape in by_key[key]:
            why = misfit(parsed[shape.shape], column.type, column.declared)
            if why is not None:
                if settings.evolution == "freeze" and why.startswith("new field"):
                    _frozen(key, [shape], why)
                misfits.append(shape.shape)
        cast_checked = column.declared and not isinstance(column.type, Struct | Array) and column.type != VARIANT
        keys.append(KeyPlan(key, column, tuple(sorted(misfits)), cast_checked))
    return ColumnsPlan(tuple(columns.values()), tuple(added), tuple(extended), tuple(keys))


def _values_type(found: list[Shape], parsed: Mapping[str, ColumnType]) -> ColumnType:
    values: ColumnType = VOID
    for shape in found:
        values = unify(values, shape_type(parsed[shape.shape]))
    return values


def _frozen(key: str, found: list[Shape], what: str) -> None:
    first = min(found, key=lambda shape: shape.partition)
    raise PayloadSchemaFrozen(
        f"payload key {key!r} ({what}, first in partition {first.partition}) has no column in the table and "
        "the feed's payload_columns.evolution is freeze: nothing of this load was committed. Add the column "
        "(declare it in payload_columns.declared, or set evolution: evolve for one load) or set evolution: "
        "rescue to keep such values in _rescued_data",
        key,
        first.partition,
    )


def payload_columns_of(schema: Mapping) -> list[PayloadColumn]:
    """The payload columns of a table's schema (Delta's schema JSON, as Spark's `StructType.jsonValue()`
    and delta-rs give it): the fields whose metadata names their key."""
    found = []
    for column in schema.get("fields", ()):
        key = (column.get("metadata") or {}).get(KEY_METADATA)
        if key is not None:
            found.append(
                PayloadColumn(
                    key,
                    column["name"],
                    type_of_json(column["type"]),
                    declared=bool(column["metadata"].get(DECLARED_METADATA)),
                )
            )
    return found
