"""A Nakadi event type's JSON Schema as the declared columns of its payload: each top-level field the
schema types exactly, as a Spark SQL DDL type (`{"amount": "DOUBLE", "items": "ARRAY<STRUCT<sku:
STRING>>"}`). A field left out is inferred from the events, as a field of an event type that
declares nothing is: the mapping never guesses.

The types: `integer` BIGINT, `number` DOUBLE, `boolean` BOOLEAN, `string` STRING (`format: date-time`
TIMESTAMP, `format: date` DATE, of a top-level property only), an object with `properties` a STRUCT of them, an array with one
`items` schema an ARRAY of it; `type: [x, "null"]` is x (every column is nullable). Not typed exactly,
so left out: no `type`, several types besides `null`, `$ref` and the combinators (`anyOf`, `oneOf`,
`allOf`, `not`, `if`), an object without properties or with typed extra keys (`patternProperties`,
an `additionalProperties` schema: a STRUCT would drop them), an array without one `items` schema. A
top-level field is left out whole when anything nested in it is, or when a nested field's name is no
Delta column name (empty, one of ` ,;{}()=`, a newline or a tab in it, or two names of one object
equal ignoring case).

What the mapping describes is the payload as stored, and Nakadi's rows keep each event as Nakadi sent
it (`read/rows.py`), so it follows the event type's `category`:
- `undefined`: the event is the schema's object: its properties.
- `business`: the schema's properties, and Nakadi's `metadata` object beside them.
- `data`: Nakadi's envelope: `data_type` and `data_op` (STRING, as Nakadi defines them), `metadata`,
  and `data`, the schema's object (a STRUCT of its properties where all of them type exactly).
`metadata` is left out, to be inferred: its fields are Nakadi's, not the event type's, and which of
them an event carries depends on the server's version and settings (`received_at`, `flow_id`,
`span_ctx`, `parent_eids`, fields newer servers enrich); a STRUCT taken from one version of the API's
definition would drop from its column the fields it does not name. A schema of another `type` than
`json_schema` (Nakadi's Avro schemas) declares nothing here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

# what a field name may not hold in a Delta table (Delta's own check of column names)
_INVALID_NAME = re.compile(r"[ ,;{}()\n\t=]")
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# keywords whose schema is not the one `type` says: a reference, or a combination of schemas
_UNTYPABLE = ("$ref", "anyOf", "oneOf", "allOf", "not", "if")
_SCALARS = {"integer": "BIGINT", "number": "DOUBLE", "boolean": "BOOLEAN", "string": "STRING"}
_STRING_FORMATS = {"date-time": "TIMESTAMP", "date": "DATE"}
# nesting deeper than this is left out: no event type nests so deep, and the mapping recurses
_MAX_DEPTH = 64
_ENVELOPE = {"data_type": "STRING", "data_op": "STRING"}  # a data change event's, besides `data`


def event_type_columns(event_type: Any) -> dict[str, str]:
    """The declared columns of the events of `event_type` (a Nakadi `EventType`, as JSON decodes it).
    Raises ValueError when it is not one (no `schema.schema` string, or one that is not JSON)."""
    if not isinstance(event_type, dict) or not isinstance(event_type.get("schema"), dict):
        raise ValueError("the event type has no schema object")
    schema = event_type["schema"]
    if schema.get("type", "json_schema") != "json_schema":
        return {}
    if not isinstance(schema.get("schema"), str):
        raise ValueError("the event type's schema.schema is not a string")
    try:
        document = json.loads(schema["schema"])
    except (ValueError, RecursionError) as error:
        raise ValueError(f"the event type's schema.schema is not JSON: {error}") from None
    category = event_type.get("category")
    if category == "data":  # the schema is that of the envelope's `data` object
        data = _struct(document, 0) if _describes_objects(document) else None
        return {**_ENVELOPE, **({"data": data} if data is not None else {})}
    columns = schema_columns(document)
    if category == "business":
        columns.pop("metadata", None)  # Nakadi's: it refuses an event type whose schema has one
    return columns


def schema_columns(schema: Any) -> dict[str, str]:
    """The top-level properties of the JSON Schema `schema` that it types exactly, each as a Spark SQL
    DDL type; the keys are the properties' names as the events carry them."""
    if not _describes_objects(schema):
        return {}
    typed = {name: _ddl(field, 1) for name, field in schema["properties"].items()}
    return {name: ddl for name, ddl in typed.items() if ddl is not None}


def _describes_objects(schema: Any) -> bool:
    """Whether `schema`, an event's, says which properties its objects have (a root may leave out
    `type: object`, as Nakadi events are objects anyway) and says it alone: beside a `$ref`, draft-04
    and draft-07 ignore the other keywords."""
    return (
        isinstance(schema, dict)
        and not any(key in schema for key in _UNTYPABLE)
        and _one_type(schema.get("type", "object")) == "object"
        and isinstance(schema.get("properties"), dict)
    )


def _ddl(schema: Any, depth: int) -> str | None:
    """The DDL type of a value `schema` describes, or None when it does not type it exactly."""
    if not isinstance(schema, dict) or any(key in schema for key in _UNTYPABLE) or depth > _MAX_DEPTH:
        return None
    kind = _one_type(schema.get("type"))
    if kind in _SCALARS:
        if kind != "string":
            return _SCALARS[kind]
        # a format types a top-level column only: a nested value is never cast (a failed cast there would
        # leave a NULL in its struct that nothing reports; a top-level one is rescued)
        return _STRING_FORMATS.get(str(schema.get("format")), "STRING") if depth == 1 else "STRING"
    if kind == "array":
        item = _ddl(schema.get("items"), depth + 1)  # a list of `items` (a tuple) is not one type
        return None if item is None else f"ARRAY<{item}>"
    if kind == "object":
        return _struct(schema, depth)
    return None


def _one_type(kind: Any) -> str | None:
    """The one type `kind` (a schema's `type`) allows besides null, or None."""
    if isinstance(kind, list):
        kinds = {k for k in kind if k != "null"}
        kind = kinds.pop() if len(kinds) == 1 else None
    return kind if isinstance(kind, str) else None


def _struct(schema: Mapping[str, Any], depth: int) -> str | None:
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return None
    if "patternProperties" in schema or isinstance(schema.get("additionalProperties"), dict):
        return None
    if len({name.lower() for name in properties}) < len(properties):
        return None  # Delta's column names are case-insensitive
    fields = []
    for name, field in properties.items():
        ddl = _ddl(field, depth + 1)
        if ddl is None or not name or _INVALID_NAME.search(name):
            return None
        fields.append(f"{_quoted(name)}: {ddl}")
    return f"STRUCT<{', '.join(fields)}>"


def _quoted(name: str) -> str:
    """`name` as a DDL struct field name: backticked where it is not a plain identifier."""
    return name if _PLAIN_NAME.fullmatch(name) else "`" + name.replace("`", "``") + "`"
