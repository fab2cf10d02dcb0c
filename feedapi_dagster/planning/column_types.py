"""The types of a columns table's payload columns (`payload_columns.py` plans them), pure: Spark's type
strings parsed (`schema_of_variant`'s and DDL), the type a load's values ask for (`shape_type`, `unify`),
an existing column's type with new nested fields (`evolve`), and whether a value fits a column unchanged
(`misfit`). The rules are the module docstring of `payload_columns.py`'s."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Delta refuses these characters in column names (without column mapping)
INVALID_NAME = re.compile(r"[ ,;{}()\n\t=]")
_INTEGERS = {"TINYINT", "SMALLINT", "INT", "INTEGER", "BIGINT", "LONG", "BYTE", "SHORT"}
_FRACTIONS = {"DOUBLE", "FLOAT", "REAL"}
# the types a declared column may have that values are cast to (a failed cast is rescued)
_CAST_FROM = {"BIGINT": "number", "DOUBLE": "number", "STRING": "string", "BOOLEAN": "boolean"}


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
        typed = [(name, kind) for name, kind in fields if not untyped(kind)]
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


def untyped(kind: ColumnType) -> bool:
    """No type said yet: `null`, `[]` (or arrays of them), `{}`."""
    if isinstance(kind, Struct):
        return not kind.fields
    if isinstance(kind, Array):
        return untyped(kind.element)
    return kind == VOID


def _field_name_ok(name: str) -> bool:
    return bool(name) and not INVALID_NAME.search(name)


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
    if untyped(a):
        return b if not untyped(b) or isinstance(b, type(a)) else a
    if untyped(b) or a == b:
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
            elif name.lower() not in names and not untyped(kind):
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
    if untyped(shape) and not isinstance(shape, Array | Struct) or column == VARIANT:
        return None
    if isinstance(shape, Struct):
        if not isinstance(column, Struct):
            return f"{path or 'the value'} is an object, its column {column.ddl()}"
        for name, kind in shape.fields:
            inner = column.get(name)
            where = f"{path}.{name}" if path else name
            if inner is None:
                if untyped(kind):
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
