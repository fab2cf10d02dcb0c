"""A Nakadi event type's JSON Schema as declared columns (`protocol/nakadi/json_schema.py`): each rule
of the mapping, what it leaves out (to be inferred), the event type's category, and that every DDL
type it gives is one Spark parses, and that the demo's events read with it lose no value."""

import json
import re

import pytest
from pyspark.sql import functions as F

from feedapi_dagster.demo.nakadi import NakadiEventType
from feedapi_dagster.protocol.nakadi.json_schema import event_type_columns, schema_columns


def columns(**properties) -> dict[str, str]:
    return schema_columns({"type": "object", "properties": properties})


def event_type(schema, category="business", schema_type="json_schema") -> dict:
    return {
        "name": "shop.orders",
        "category": category,
        "owning_application": "shop",
        "schema": {"type": schema_type, "schema": json.dumps(schema)},
    }


STRING = {"type": "string"}

# every rule that types a field, with the DDL it gives
TYPED = {
    "an_integer": ({"type": "integer"}, "BIGINT"),
    "a_number": ({"type": "number", "minimum": 0}, "DOUBLE"),
    "a_boolean": ({"type": "boolean"}, "BOOLEAN"),
    "a_string": ({"type": "string", "enum": ["a", "b"]}, "STRING"),
    "a_uuid": ({"type": "string", "format": "uuid"}, "STRING"),
    "a_timestamp": ({"type": "string", "format": "date-time"}, "TIMESTAMP"),
    "a_date": ({"type": "string", "format": "date"}, "DATE"),
    "nullable": ({"type": ["null", "integer"]}, "BIGINT"),
    "nullable_timestamp": ({"type": ["string", "null"], "format": "date-time"}, "TIMESTAMP"),
    "numbers": ({"type": "array", "items": {"type": "number"}}, "ARRAY<DOUBLE>"),
    "matrix": ({"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}, "ARRAY<ARRAY<BIGINT>>"),
    "items": (
        {
            "type": "array",
            "items": {"type": "object", "properties": {"sku": STRING, "qty": {"type": "integer"}}},
        },
        "ARRAY<STRUCT<sku: STRING, qty: BIGINT>>",
    ),
    "customer": (
        {
            "type": ["object", "null"],
            "properties": {
                "id": {"type": "integer"},
                "first.name": STRING,
                "e-mail": STRING,
                "back`tick": STRING,
                "1st": {"type": "boolean"},
                "address": {
                    "type": "object",
                    "properties": {"city": STRING, "since": {"type": "string", "format": "date"}},
                    "additionalProperties": False,
                },
            },
            "required": ["id"],
        },
        "STRUCT<id: BIGINT, `first.name`: STRING, `e-mail`: STRING, `back``tick`: STRING, `1st`: BOOLEAN, "
        "address: STRUCT<city: STRING, since: STRING>>",  # a format types a top-level property only
    ),
    # Spark SQL keywords as nested names
    "keywords": (
        {"type": "object", "properties": {name: STRING for name in ("select", "from", "order", "struct", "date")}},
        "STRUCT<select: STRING, from: STRING, order: STRING, struct: STRING, date: STRING>",
    ),
}


def test_each_typed_rule():
    assert columns(**{name: schema for name, (schema, _) in TYPED.items()}) == {
        name: ddl for name, (_, ddl) in TYPED.items()
    }


def deep(levels: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


# what the mapping cannot type exactly: left out, never guessed
LEFT_OUT = {
    "no_type": {"description": "anything"},
    "only_null": {"type": "null"},
    "two_types": {"type": ["integer", "string"]},
    "two_types_and_null": {"type": ["integer", "number", "null"]},
    "unknown_type": {"type": "decimal"},
    "any_of": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
    "one_of": {"oneOf": [STRING, {"type": "string", "format": "date"}]},
    "typed_with_one_of": {"type": "string", "oneOf": [{"format": "date"}, {"format": "date-time"}]},
    "all_of": {"allOf": [{"type": "integer"}]},
    "ref": {"$ref": "#/definitions/money"},
    "ref_beside_a_type": {"$ref": "#/definitions/money", "type": "number"},  # draft-04/07 ignore the type
    "not": {"type": "integer", "not": {"enum": [0]}},
    "object_without_properties": {"type": "object"},
    "object_with_no_properties": {"type": "object", "properties": {}},
    "a_map": {"type": "object", "properties": {"n": STRING}, "additionalProperties": STRING},
    "pattern_properties": {"type": "object", "properties": {"n": STRING}, "patternProperties": {"^x": STRING}},
    "array_without_items": {"type": "array"},
    "a_tuple": {"type": "array", "items": [STRING, {"type": "integer"}]},
    "array_of_untyped": {"type": "array", "items": {}},
    "boolean_schema": True,
    "nested_untyped": {"type": "object", "properties": {"ok": STRING, "any": {}}},
    "deeply_nested_ref": {
        "type": "array",
        "items": {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"$ref": "#/x"}}}}},
    },
    # nested names that are no Delta column names: the whole top-level field
    "empty_name": {"type": "object", "properties": {"": STRING}},
    **{
        f"name_with_{i}": {"type": "object", "properties": {f"a{char}b": STRING}}
        for i, char in enumerate(" ,;{}()\n\t=")
    },
    "names_equal_ignoring_case": {"type": "object", "properties": {"Id": STRING, "id": STRING}},
    "in_an_array": {"type": "array", "items": {"type": "object", "properties": {"a b;": STRING}}},
    "too_deep": deep(70),
}


def test_what_cannot_be_typed_exactly_is_left_out():
    assert columns(kept={"type": "integer"}, **LEFT_OUT) == {"kept": "BIGINT"}
    assert columns(nested=deep(60)) == {"nested": "STRUCT<a: " * 60 + "BIGINT" + ">" * 60}


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "items": {"type": "object", "properties": {"a": STRING}}},
        {"$ref": "#/definitions/order", "properties": {"a": STRING}},
        {"anyOf": [{"properties": {"a": STRING}}], "properties": {"a": STRING}},
        {"type": "object"},
        {"properties": ["a"]},
        "not a schema",
    ],
)
def test_a_schema_that_does_not_say_its_objects_properties_declares_nothing(schema):
    assert schema_columns(schema) == {}


def test_a_root_without_type_object_still_declares_its_properties():
    assert schema_columns({"properties": {"a": STRING}}) == {"a": "STRING"}


ORDER = {
    "type": "object",
    "properties": {"order_number": STRING, "total": {"type": "number"}, "lines": {"type": "array"}},
}


def test_the_category_says_what_the_stored_payload_holds():
    """Nakadi's rows keep the event as Nakadi sent it: a business event has Nakadi's `metadata` beside
    the schema's fields, a data change event the schema's object under `data` in Nakadi's envelope;
    `metadata` is left out (inferred): which fields it holds is the server's, not the schema's."""
    expected = {"order_number": "STRING", "total": "DOUBLE"}
    assert event_type_columns(event_type(ORDER, "undefined")) == expected
    assert event_type_columns(event_type(ORDER, "business")) == expected
    metadata = {"type": "object", "properties": {"eid": STRING}}
    with_metadata = {**ORDER, "properties": {**ORDER["properties"], "metadata": metadata}}
    assert event_type_columns(event_type(with_metadata, "business")) == expected
    # an undefined event type's events are the producer's alone: its `metadata` is the schema's
    assert event_type_columns(event_type({"properties": {"metadata": metadata}}, "undefined")) == {
        "metadata": "STRUCT<eid: STRING>"
    }
    typed_order = {"properties": {"order_number": STRING, "total": {"type": "number"}}}
    assert event_type_columns(event_type(typed_order, "data")) == {
        "data_type": "STRING",
        "data_op": "STRING",
        "data": "STRUCT<order_number: STRING, total: DOUBLE>",
    }
    # a data change event whose object the schema does not type whole: `data` is inferred
    assert event_type_columns(event_type(ORDER, "data")) == {"data_type": "STRING", "data_op": "STRING"}


def test_a_schema_of_another_type_declares_nothing_and_a_broken_event_type_is_an_error():
    assert event_type_columns(event_type(ORDER, schema_type="avro_schema")) == {}
    for broken, said in [
        ([], "no schema object"),
        ({"name": "x"}, "no schema object"),
        ({"schema": {"type": "json_schema"}}, "not a string"),
        ({"schema": {"type": "json_schema", "schema": "{not json"}}, "not JSON"),
        ({"schema": {"type": "json_schema", "schema": "[" * 100_000}}, "not JSON"),
    ]:
        with pytest.raises(ValueError, match=said):
            event_type_columns(broken)


def spark_simple_string(ddl: str) -> str:
    """How Spark writes the type `ddl` declares (`DataType.simpleString`): lower case, names unquoted."""
    unquoted = ddl.replace("``", "\0").replace("`", "").replace("\0", "`").replace(": ", ":").replace(", ", ",")
    return re.sub(r"\b(BIGINT|DOUBLE|BOOLEAN|STRING|TIMESTAMP|DATE|STRUCT|ARRAY)\b", lambda m: m[0].lower(), unquoted)


def test_every_declared_type_parses_in_spark_and_reads_the_demo_events(spark, tmp_path):
    """Each DDL string is one Spark takes as a column's type and Delta as a table's (nested names
    included), and the demo event type's declared columns read every demo event's fields as they are
    (`FAILFAST`: a value of another type fails the read)."""
    declared = columns(**{name: schema for name, (schema, _) in TYPED.items()})
    for key, ddl in declared.items():
        parsed = spark.createDataFrame([], f"`{key}` {ddl}").schema[key].dataType
        assert parsed.simpleString() == spark_simple_string(ddl)  # nested names kept as the events have them
    table = str(tmp_path / "declared")
    spark.createDataFrame([], ", ".join(f"`{key}` {ddl}" for key, ddl in declared.items())).write.format("delta").save(
        table
    )
    assert spark.read.format("delta").load(table).columns == list(declared)

    demo = NakadiEventType(partitions=1, events=50, seed=3)
    demo_columns = event_type_columns(demo.definition())
    assert demo_columns == {"order_number": "STRING", "amount": "DOUBLE", "seq": "BIGINT"}
    events = [json.loads(raw) for _, raw in demo.read(0, "BEGIN", 100)]
    assert all(set(event) == {"metadata", *demo_columns} for event in events)
    ddl = ", ".join(f"`{key}` {value}" for key, value in demo_columns.items())
    payloads = spark.createDataFrame([(json.dumps(event),) for event in events], "payload STRING")
    read = payloads.select(F.from_json("payload", ddl, {"mode": "FAILFAST"}).alias("e")).select("e.*").collect()
    assert [row.asDict() for row in read] == [{key: event[key] for key in demo_columns} for event in events]
