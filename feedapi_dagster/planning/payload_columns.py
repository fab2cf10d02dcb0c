"""The typed columns of a `payload_form: columns` table, planned for one write: pure (no Spark).

Spark tells what the write's payloads hold, as a list of `Shape`s: each top-level key of the object
payloads, with the type Spark's `schema_of_variant` gives its value (`BIGINT`, `OBJECT<a: STRING>`...),
how many rows have it and the first partition that does. `plan_columns` decides, from these and the
table's payload columns as they are, what the write does:

* **types** (`ColumnType`): integers are `BIGINT`, other numbers `DOUBLE` (a load that sees both makes
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
  the table: measured). A value fits its column when its shape does exactly (`fits`): an integer fits
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
  over inference: their type is used as it is and a value is cast to it (a value Spark cannot cast is
  rescued).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from feedapi_dagster.errors import PayloadSchemaFrozen

Evolution = Literal["evolve", "rescue", "freeze"]
DEFAULT_EVOLUTION: Evolution = "evolve"
RESCUE_COLUMN = "_rescued_data"
# a payload column's field metadata: the payload key it holds
KEY_METADATA = "feedapi.key"
DECLARED_METADATA = "feedapi.declared"

_INVALID_NAME = re.compile(r"[ ,;{}()\n\t=]")
_INTEGERS = {"TINYINT", "SMALLINT", "INT", "INTEGER", "BIGINT", "LONG", "BYTE", "SHORT"}
_FRACTIONS = {"DOUBLE", "FLOAT", "REAL"}
# the types a declared column may have that values are cast to (a failed cast is rescued)
_CAST_FROM = {"BIGINT": "number", "DOUBLE": "number", "STRING": "string", "BOOLEAN": "boolean"}


# ---------------------------------------------------------------------- types
@dataclass(frozen=True)
class Scalar:
    """A scalar type by its Spark SQL name (`BIGINT`, `DECIMAL(10,2)`); `VOID`: no type said yet."""

    name: str

    def ddl(self) -> str:
        return self.name


@dataclass(frozen=True)
class Struct:
    fields: tuple[tuple[str, ColumnType], ...]

    def ddl(self) -> str:
        return "STRUCT<" + ", ".join(f"{quoted(name)}: {kind.ddl()}" for name, kind in self.fields) + ">"

    def get(self, name: str) -> ColumnType | None:
        return next((kind for found, kind in self.fields if found == name), None)


@dataclass(frozen=True)
class Array:
    element: ColumnType

    def ddl(self) -> str:
        return f"ARRAY<{self.element.ddl()}>"


ColumnType = Scalar | Struct | Array
VOID = Scalar("VOID")
VARIANT = Scalar("VARIANT")
BIGINT = Scalar("BIGINT")
DOUBLE = Scalar("DOUBLE")
BIG_INTEGER = Scalar("DECIMAL(38,0)")


def quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class TypeSyntaxError(ValueError):
    """A type string that is neither Spark's `schema_of_variant` nor Spark SQL DDL."""


class _TypeParser:
    """Spark's type strings: `schema_of_variant`'s (`OBJECT<a: BIGINT, `b c`: ARRAY<STRING>>`) and DDL
    (`STRUCT<a: BIGINT>`, `struct<a bigint>`, `DECIMAL(10,2)`)."""

    def __init__(self, text: str):
        self.text = text
        self.at = 0

    def parse(self) -> ColumnType:
        kind = self._type()
        self._space()
        if self.at != len(self.text):
            raise TypeSyntaxError(f"unexpected {self.text[self.at :]!r} in type {self.text!r}")
        return kind

    def _space(self) -> None:
        while self.at < len(self.text) and self.text[self.at].isspace():
            self.at += 1

    def _eat(self, token: str) -> bool:
        self._space()
        if self.text.startswith(token, self.at):
            self.at += len(token)
            return True
        return False

    def _expect(self, token: str) -> None:
        if not self._eat(token):
            raise TypeSyntaxError(f"expected {token!r} at {self.at} in type {self.text!r}")

    def _word(self) -> str:
        self._space()
        match = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(self.text, self.at)
        if match is None:
            raise TypeSyntaxError(f"expected a name at {self.at} in type {self.text!r}")
        self.at = match.end()
        return match.group()

    def _name(self) -> str:
        self._space()
        if not self._eat("`"):
            return self._word()
        name = []
        while True:
            end = self.text.find("`", self.at)
            if end < 0:
                raise TypeSyntaxError(f"unclosed ` in type {self.text!r}")
            name.append(self.text[self.at : end])
            self.at = end + 1
            if not self.text.startswith("`", self.at):  # `` is a backtick inside the name
                return "".join(name)
            name.append("`")
            self.at += 1

    def _type(self) -> ColumnType:
        word = self._word().upper()
        if word in ("OBJECT", "STRUCT"):
            self._expect("<")
            fields: list[tuple[str, ColumnType]] = []
            while not self._eat(">"):
                if fields:
                    self._expect(",")
                name = self._name()
                self._eat(":")
                fields.append((name, self._type()))
            return Struct(tuple(fields))
        if word == "ARRAY":
            self._expect("<")
            element = self._type()
            self._expect(">")
            return Array(element)
        if self._eat("("):
            close = self.text.index(")", self.at)
            word += "(" + self.text[self.at : close].replace(" ", "") + ")"
            self.at = close + 1
        return Scalar(word)


def parse_type(text: str) -> ColumnType:
    """A type from Spark's `schema_of_variant` or Spark SQL DDL; `TypeSyntaxError` otherwise."""
    return _TypeParser(text).parse()


_DECLARABLE = re.compile(
    r"(BIGINT|INT|INTEGER|SMALLINT|TINYINT|DOUBLE|FLOAT|REAL|BOOLEAN|STRING|DATE|TIMESTAMP|TIMESTAMP_NTZ|"
    r"VARIANT|BINARY|DECIMAL(\(\d+(,\d+)?\))?|(VAR)?CHAR\(\d+\))"
)


def declared_type(ddl: str) -> ColumnType:
    """A declared column's type from Spark SQL DDL; `TypeSyntaxError` for one that is not, or names a
    scalar type Spark has not."""
    kind = parse_type(ddl)
    unknown = [name for name in _scalar_names(kind) if not _DECLARABLE.fullmatch(name)]
    if unknown:
        raise TypeSyntaxError(f"{ddl!r} names types Spark SQL has not: {', '.join(unknown)}")
    return kind


def _scalar_names(kind: ColumnType) -> list[str]:
    if isinstance(kind, Struct):
        return [name for _, inner in kind.fields for name in _scalar_names(inner)]
    if isinstance(kind, Array):
        return _scalar_names(kind.element)
    return [kind.name]


def shape_type(shape: ColumnType) -> ColumnType:
    """The column type a value's shape asks for: integers `BIGINT`, other numbers `DOUBLE`, fields of no
    type yet (`VOID`, `[]`, `{}`) left out, Delta-refused field names left out (the value then does not
    fit, and is rescued); anything JSON cannot say (dates...) `VARIANT`."""
    if isinstance(shape, Struct):
        fields = [(name, shape_type(kind)) for name, kind in shape.fields if _field_name_ok(name)]
        typed = [(name, kind) for name, kind in fields if not _untyped(kind)]
        return Struct(tuple(_first_of_each_name(typed)))
    if isinstance(shape, Array):
        return Array(shape_type(shape.element))
    name = shape.name
    if name in _INTEGERS:
        return BIGINT
    if name in _FRACTIONS:
        return DOUBLE
    if name.startswith("DECIMAL"):
        return _decimal_type(name)
    if name in ("BOOLEAN", "STRING", "VOID", "VARIANT"):
        return shape
    return VARIANT


_DECIMAL = re.compile(r"DECIMAL\((\d+),(\d+)\)")
# the digits a DOUBLE holds exactly whatever they are (a decimal of at most 15 digits reads back the same)
_DOUBLE_DIGITS = 15


def _decimal_type(name: str) -> ColumnType:
    """The type of a number Spark's variant holds as a decimal: `DOUBLE` where it holds it exactly; an
    integer beyond `BIGINT` `DECIMAL(38,0)`; else (more digits than a double keeps) `VARIANT`, which
    keeps it as it is."""
    match = _DECIMAL.fullmatch(name)
    precision, scale = (int(match.group(1)), int(match.group(2))) if match else (38, 38)
    if precision <= _DOUBLE_DIGITS:
        return DOUBLE
    return BIG_INTEGER if scale == 0 and precision <= 38 else VARIANT


def _untyped(kind: ColumnType) -> bool:
    """No type said yet: `null`, `[]` (or arrays of them), `{}`."""
    if isinstance(kind, Struct):
        return not kind.fields
    if isinstance(kind, Array):
        return _untyped(kind.element)
    return kind == VOID


def _field_name_ok(name: str) -> bool:
    return bool(name) and not _INVALID_NAME.search(name)


def _first_of_each_name(fields: Iterable[tuple[str, ColumnType]]) -> list[tuple[str, ColumnType]]:
    """Fields whose names Spark tells apart (ignoring case): of those it does not, the first in sort order."""
    seen: set[str] = set()
    kept = []
    for name, kind in sorted(fields, key=lambda item: item[0]):
        if name.lower() not in seen:
            seen.add(name.lower())
            kept.append((name, kind))
    return kept


def unify(a: ColumnType, b: ColumnType) -> ColumnType:
    """The type of a new column whose values have types `a` and `b` (one write's values: no order)."""
    if _untyped(a):
        return b if not _untyped(b) or isinstance(b, type(a)) else a
    if _untyped(b) or a == b:
        return a
    if {a, b} == {BIGINT, DOUBLE}:
        return DOUBLE
    if {a, b} == {BIGINT, BIG_INTEGER}:
        return BIG_INTEGER
    if isinstance(a, Struct) and isinstance(b, Struct):
        merged = dict(a.fields)
        for name, kind in b.fields:
            merged[name] = unify(merged[name], kind) if name in merged else kind
        return Struct(tuple(_first_of_each_name(merged.items())))
    if isinstance(a, Array) and isinstance(b, Array):
        return Array(unify(a.element, b.element))
    return VARIANT


def evolve(column: ColumnType, values: ColumnType) -> ColumnType:
    """An existing column's type with the nested fields of `values` it lacks added (`evolve` mode);
    no type it has changes."""
    if isinstance(column, Struct) and isinstance(values, Struct):
        fields = list(column.fields)
        names = {name.lower() for name, _ in fields}
        for name, kind in values.fields:
            if (existing := column.get(name)) is not None:
                fields = [(n, evolve(existing, kind) if n == name else k) for n, k in fields]
            elif name.lower() not in names and not _untyped(kind):
                fields.append((name, kind))
                names.add(name.lower())
        return Struct(tuple(fields))
    if isinstance(column, Array) and isinstance(values, Array):
        return Array(evolve(column.element, values.element))
    return column


def misfit(shape: ColumnType, column: ColumnType, declared: bool = False, path: str = "") -> str | None:
    """Why a value of `shape` (as `schema_of_variant` says it) does not fit `column` unchanged; None where
    it does. `declared`: the column's type is the user's (a top-level scalar is cast, and a failed cast is
    rescued; nested values are not cast: a failed cast there would be a NULL nothing reports)."""
    if _untyped(shape) and not isinstance(shape, Array | Struct) or column == VARIANT:
        return None
    if isinstance(shape, Struct):
        if not isinstance(column, Struct):
            return f"{path or 'the value'} is an object, its column {column.ddl()}"
        for name, kind in shape.fields:
            inner = column.get(name)
            where = f"{path}.{name}" if path else name
            if inner is None:
                if _untyped(kind):
                    continue  # null, [] or {}: no type said, the field reads as absent (NULL)
                return f"new field {where}"
            if (why := misfit(kind, inner, path=where)) is not None:  # a nested value is never cast
                return why
        return None
    if isinstance(shape, Array):
        if not isinstance(column, Array):
            return f"{path or 'the value'} is an array, its column {column.ddl()}"
        return misfit(shape.element, column.element, path=f"{path}[]")
    if isinstance(column, Struct | Array):
        return f"{path or 'the value'} is {shape.name}, its column {column.ddl()}"
    value = shape_type(shape)
    if value == column or (value == BIGINT and column in (DOUBLE, BIG_INTEGER)):
        return None
    if declared and _CAST_FROM.get(value.ddl()) == _cast_kind(column):
        return None
    return f"{path or 'the value'} is {shape.name}, its column {column.ddl()}"


def _cast_kind(column: ColumnType) -> str | None:
    name = column.ddl().upper()
    if name in _INTEGERS or name in _FRACTIONS or name.startswith("DECIMAL"):
        return "number"
    if name in ("STRING", "DATE", "TIMESTAMP", "TIMESTAMP_NTZ") or name.startswith(("CHAR", "VARCHAR")):
        return "string"
    return "boolean" if name == "BOOLEAN" else None


# ---------------------------------------------------------------------- the plan
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

    def with_server_declared(self, server: Mapping[str, str]) -> ColumnsSettings:
        """These settings with the types the feed's server declares (a Nakadi event type's JSON Schema):
        the feed's own declarations win."""
        return ColumnsSettings(self.evolution, {**server, **self.declared})


def column_name(key: str, taken: Iterable[str]) -> str:
    """The column a new key gets (see the module docstring), given the names `taken` already."""
    taken_lower = {name.lower() for name in taken}
    base = _INVALID_NAME.sub("_", key) or "_"
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
            if _untyped(values):
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
            if not all(_untyped(parsed[shape.shape]) for shape in by_key[key]):
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


_JSON_SCALARS = {"long": "BIGINT", "integer": "INT", "short": "SMALLINT", "byte": "TINYINT", "float": "FLOAT"}


def type_of_json(kind: object) -> ColumnType:
    """A type of Delta's schema JSON (`"long"`, `{"type": "struct", ...}`)."""
    if isinstance(kind, str):
        return Scalar(_JSON_SCALARS.get(kind, kind.upper().replace(" ", "")))
    assert isinstance(kind, Mapping)
    if kind["type"] == "struct":
        return Struct(tuple((f["name"], type_of_json(f["type"])) for f in kind["fields"]))
    if kind["type"] == "array":
        return Array(type_of_json(kind["elementType"]))
    raise TypeSyntaxError(f"a payload column of type {kind['type']} (maps are not payload columns)")
