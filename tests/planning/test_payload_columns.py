"""The typed columns' plan (`planning.payload_columns`), pure: Spark's shape strings parsed, the types a
load's values ask for, what fits a column unchanged, names Delta cannot take, and the evolution modes."""

import pytest

from feedapi_dagster.errors import PayloadSchemaFrozen
from feedapi_dagster.planning.column_types import (
    BIGINT,
    DOUBLE,
    VARIANT,
    Array,
    Scalar,
    Struct,
    TypeSyntaxError,
    declared_type,
    misfit,
    parse_type,
    shape_type,
    unify,
)
from feedapi_dagster.planning.payload_columns import ColumnsSettings, PayloadColumn, Shape, column_name, plan_columns

RESERVED = ("partition_id", "position", "payload", "data", "_rescued_data")


def test_spark_type_strings_parse_with_quoted_names_and_decimals():
    kind = parse_type("OBJECT<`a b`: ARRAY<DECIMAL(21, 1)>, `x``y`: VOID, n: OBJECT<>>")
    assert kind == Struct((("a b", Array(Scalar("DECIMAL(21,1)"))), ("x`y", Scalar("VOID")), ("n", Struct(()))))
    assert parse_type("struct<a bigint, b: array<string>>") == Struct((("a", BIGINT), ("b", Array(Scalar("STRING")))))
    assert parse_type(Struct((("a b", BIGINT),)).ddl()) == Struct((("a b", BIGINT),))
    with pytest.raises(TypeSyntaxError):
        parse_type("STRUCT<a: BIGINT")
    with pytest.raises(TypeSyntaxError, match="INTEGR"):
        declared_type("STRUCT<a: INTEGR>")


def test_the_types_values_ask_for():
    assert shape_type(parse_type("INT")) == BIGINT
    assert shape_type(parse_type("DECIMAL(4,1)")) == DOUBLE
    assert shape_type(parse_type("DECIMAL(23,0)")) == Scalar("DECIMAL(38,0)")  # beyond BIGINT, exactly
    assert shape_type(parse_type("DECIMAL(30,10)")) == VARIANT  # more digits than a double keeps
    # fields of no type yet, and names Delta refuses, are left out
    assert shape_type(parse_type("OBJECT<a: VOID, b: ARRAY<VOID>, c: OBJECT<>, `d e`: BIGINT, f: BIGINT>")) == Struct(
        (("f", BIGINT),)
    )
    assert unify(BIGINT, DOUBLE) == DOUBLE and unify(BIGINT, Scalar("STRING")) == VARIANT
    assert unify(Struct((("a", BIGINT),)), Struct((("b", DOUBLE), ("a", DOUBLE)))) == Struct(
        (("a", DOUBLE), ("b", DOUBLE))
    )
    # two fields Spark takes for one: the first in sort order
    assert unify(Struct((("amount", BIGINT),)), Struct((("Amount", BIGINT),))) == Struct((("Amount", BIGINT),))


def test_what_fits_a_column_unchanged():
    assert misfit(parse_type("BIGINT"), DOUBLE) is None
    assert misfit(parse_type("DOUBLE"), BIGINT) == "the value is DOUBLE, its column BIGINT"
    assert misfit(parse_type("STRING"), BIGINT) is not None  # Spark would cast "12" to 12
    assert misfit(parse_type("BIGINT"), Scalar("STRING")) is not None
    assert misfit(parse_type("VOID"), BIGINT) is None
    column = Struct((("name", Scalar("STRING")),))
    assert misfit(parse_type("OBJECT<name: STRING, tier: VOID, tags: ARRAY<VOID>>"), column) is None
    assert misfit(parse_type("OBJECT<name: STRING, vip: BOOLEAN>"), column) == "new field vip"
    assert misfit(parse_type("OBJECT<name: OBJECT<first: STRING>>"), column) == ("name is an object, its column STRING")
    assert misfit(parse_type("ARRAY<DOUBLE>"), Array(BIGINT)) == "[] is DOUBLE, its column BIGINT"
    assert misfit(parse_type("OBJECT<a: BIGINT>"), VARIANT) is None
    # a declared scalar is cast (a failed cast rescued); nested values never are
    assert misfit(parse_type("STRING"), Scalar("TIMESTAMP"), declared=True) is None
    assert misfit(parse_type("BIGINT"), Scalar("DECIMAL(12,2)"), declared=True) is None
    assert misfit(parse_type("OBJECT<t: STRING>"), Struct((("t", Scalar("TIMESTAMP")),)), declared=True) is not None


def test_names_delta_cannot_take_and_names_taken():
    assert column_name("amount", RESERVED) == "amount"
    assert column_name("a b,c;d{e}(f)=g", RESERVED) == "a_b_c_d_e__f__g"
    assert column_name("", RESERVED) == "_"
    assert column_name("position", RESERVED) == "position_1"
    assert column_name("Amount", [*RESERVED, "amount", "Amount_1"]) == "Amount_2"


def shapes(*found: tuple[str, str, int, int]) -> list[Shape]:
    return [Shape(key, shape, rows, partition) for key, shape, rows, partition in found]


def test_evolve_adds_keys_and_nested_fields_and_rescues_what_does_not_fit():
    first = plan_columns(
        [], shapes(("amount", "BIGINT", 5, 0), ("c", "OBJECT<n: STRING>", 5, 0)), ColumnsSettings(), RESERVED
    )
    assert [(c.key, c.name, c.type.ddl()) for c in first.added] == [
        ("amount", "amount", "BIGINT"),
        ("c", "c", "STRUCT<`n`: STRING>"),
    ]
    second = plan_columns(
        first.columns,
        shapes(("amount", "DOUBLE", 1, 1), ("amount", "BIGINT", 3, 1), ("c", "OBJECT<n: STRING, v: BOOLEAN>", 2, 0)),
        ColumnsSettings(),
        RESERVED,
    )
    assert not second.added and [c.type.ddl() for c in second.extended] == ["STRUCT<`n`: STRING, `v`: BOOLEAN>"]
    (amount, c) = second.keys
    assert amount.misfits == ("DOUBLE",) and amount.rescues  # Delta cannot widen BIGINT to DOUBLE
    assert c.misfits == () and not c.rescues
    # the key more rows have gets the name
    names = plan_columns(
        [], shapes(("Amount", "BIGINT", 1, 0), ("amount", "BIGINT", 9, 0)), ColumnsSettings(), RESERVED
    )
    assert {c.key: c.name for c in names.added} == {"amount": "amount", "Amount": "Amount_1"}


def test_rescue_and_freeze_keep_the_first_loads_columns():
    existing = [PayloadColumn("amount", "amount", BIGINT)]
    new = shapes(("amount", "BIGINT", 3, 0), ("coupon", "STRING", 1, 2), ("c", "OBJECT<>", 1, 0))
    rescued = plan_columns(existing, new, ColumnsSettings("rescue"), RESERVED)
    assert not rescued.changes_schema
    assert [(k.key, k.column) for k in rescued.keys if k.column is None] == [("coupon", None)]  # {} needs nothing
    with pytest.raises(PayloadSchemaFrozen, match=r"'coupon' \(a new key, first in partition 2\)") as frozen:
        plan_columns(existing, new, ColumnsSettings("freeze"), RESERVED)
    assert (frozen.value.key, frozen.value.partition) == ("coupon", 2)
    # a table's first payload columns come from its first load, whatever the mode
    assert plan_columns([], new, ColumnsSettings("freeze"), RESERVED).changes_schema


def test_declared_columns_win_and_are_cast():
    settings = ColumnsSettings(declared={"at": "TIMESTAMP", "amount": "DECIMAL(12,2)"})
    plan = plan_columns([], shapes(("at", "STRING", 2, 0), ("amount", "BIGINT", 2, 0)), settings, RESERVED)
    assert {c.key: (c.type.ddl(), c.declared) for c in plan.columns} == {
        "amount": ("DECIMAL(12,2)", True),
        "at": ("TIMESTAMP", True),
    }
    assert all(k.cast_checked and not k.misfits for k in plan.keys)
    assert ColumnsSettings(declared={"at": "DATE"}).with_server_declared(
        {"at": "TIMESTAMP", "n": "BIGINT"}
    ).declared == {
        "at": "DATE",
        "n": "BIGINT",
    }
