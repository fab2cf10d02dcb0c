"""`payload_form: columns`: a producer whose events change (fields appear, types widen and clash, nested
objects and arrays, nulls, awkward names) loads every value typed in its column or kept in
`_rescued_data`, compared with each event's JSON; new columns land in the commit of the rows that bring
them; a frozen contract fails a load and commits nothing; two loads that add columns at once end with
both. Both layouts, and on the S3 server."""

import json

import pytest

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.errors import PayloadFormMismatch, PayloadSchemaFrozen
from feedapi_dagster.planning.payload_columns import ColumnsSettings

from .conftest import ON_S3, add_odd_events, assert_columns_are_the_payload
from .test_crash import assert_every_event_once

# the first load's odd events: awkward names (a space, a dot, a comma, an empty key, a project column's
# name, two keys Spark takes for one, both quotes), nested objects and arrays, nulls (one in a VARIANT
# column), a mixed array
FIRST = [
    {"id": "t-1", "amount": 10, "ratio": 1, "mixed": 5, "customer": {"name": "Zoë", "tier": 2}, "tags": ["a"]},
    {"id": "t-2", "amount": 11, "ratio": 2.5, "mixed": "five", "customer": {"name": "Al"}, "tags": []},
    {"a b": 1, "x.y": "dot", "c,d": True, "": 0, "position": 99, "Amount": 3, "both'\"": 1, "n": None, "mixed": None},
    {"items": [{"sku": "x", "qty": 2}, {"sku": "y", "qty": 1, "note": None}], "mixedlist": [1, "two"]},
]
# the second load's: a new top-level field, a new nested field, a float where the column is BIGINT
# (Delta cannot widen BIGINT to DOUBLE: rescued), a string where it is BIGINT, an object where it is
# STRING, a new key that differs only by case from a column's
SECOND = [
    {"id": "t-3", "amount": 12.5, "coupon": "X1", "customer": {"name": "Bo", "tier": 3, "vip": True}},
    {"id": "t-4", "amount": "n/a", "ratio": 3, "customer": {"name": {"first": "Cy"}}, "ID": "upper"},
    {"id": "t-5", "amount": 13, "items": [{"sku": "z", "qty": 1, "gift": True}]},
]


def publish(feed, events, partition):
    for event in events:
        feed.add_event(json.dumps(event), partition=partition)


def history(spark, path):
    return spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()


def column_types(spark, path) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in spark.read.format("delta").load(path).schema.fields}


@pytest.mark.parametrize("layout", ["clustered", "partitioned"])
def test_an_evolving_producer_lands_every_value_in_its_column_or_rescued(spark, make_loader, table_path, layout):
    feed = DemoFeed(partitions=2, events=200, seed=41)  # generated objects and string payloads
    with DemoFeedServer(feed, dialect="published") as server:
        publish(feed, FIRST, partition=0)
        unparseable = add_odd_events(feed, partition=1)
        first = make_loader(server, layout=layout, payload_form="columns").sync()
        types = column_types(spark, table_path)
        # integers BIGINT; ints and floats in one load DOUBLE; no common type VARIANT; objects structs
        assert types["amount"] == "bigint" and types["ratio"] == "double" and types["mixed"] == "variant"
        # (the odd events' `customer` has `tags` too; the demo's own payloads nest theirs under `data`,
        # a project column's name: `data_1`)
        assert types["customer"] == "struct<name:string,tags:array<string>,tier:bigint>"
        assert types["items"] == "array<struct<qty:bigint,sku:string>>" and types["data_1"].startswith("struct<")
        assert types["mixedlist"] == "array<variant>"
        # names: Delta's refused characters become `_`, the empty key `_`, a project column's name and a
        # name Spark takes for another's get a suffix; a key null only has no column yet
        assert {"a_b", "x.y", "c_d", "_", "position_1", "both'\""} <= set(types)
        assert "Amount_1" in types and "n" not in types and "tags" in types  # `amount` is the key more rows have
        assert assert_columns_are_the_payload(spark, table_path, unparseable) == {}
        assert {pid: r.rescued_values for pid, r in first.items()} == {0: 0, 1: 0}
        assert {pid: r.unparsed_payloads for pid, r in first.items()} == {0: 0, 1: len(unparseable)}
        assert set(first[0].columns_added) >= {"amount", "customer", "items"}
        operations = [h.operation for h in history(spark, table_path)]
        assert operations == ["CREATE TABLE", "WRITE"]  # one commit: the columns, the rows, the cursors

        before = len(operations)
        publish(feed, SECOND, partition=1)
        feed.append(30)
        second = make_loader(server, layout=layout, payload_form="columns").sync()
        entries = history(spark, table_path)
        assert [h.operation for h in entries[before:]] == ["WRITE"]  # the new columns in the rows' commit
        types = column_types(spark, table_path)
        assert types["coupon"] == "string" and types["amount"] == "bigint"
        assert types["customer"] == "struct<name:string,tags:array<string>,tier:bigint,vip:boolean>"
        assert types["items"] == "array<struct<qty:bigint,sku:string,gift:boolean>>"
        rescued = assert_columns_are_the_payload(spark, table_path, unparseable)
        # 12.5 and "n/a" in a BIGINT column, an object in a STRING field: rescued; "ID" beside "id": its column
        assert rescued == {1: 2}
        assert second[1].rescued_values == 2 and "coupon" in second[1].columns_added
        assert "customer" in second[1].columns_extended
        spark_rows = spark.read.format("delta").load(table_path).where("id = 't-4'").collect()
        assert json.loads(spark_rows[0]["_rescued_data"]) == {"amount": "n/a", "customer": {"name": {"first": "Cy"}}}

        # a rebuild writes the partition's rows again, typed by the columns the table has now
        make_loader(server, layout=layout, payload_form="columns").rebuild([0])
        assert assert_columns_are_the_payload(spark, table_path, unparseable) == {1: 2}
        with pytest.raises(
            PayloadFormMismatch, match=r"typed payload columns and `_rescued_data`.*payload_form is variant"
        ):
            make_loader(server, payload_form="variant")
    assert_every_event_once(spark, table_path, feed, exactly_once=True)


def test_a_table_that_does_not_keep_the_payload_text_holds_every_value_in_columns(spark, make_loader, table_path):
    """`keep_payload: false`: an object payload's text is not stored beside its typed values; a string
    payload and one Spark cannot parse keep theirs (nothing else holds them), and are counted."""
    feed = DemoFeed(partitions=2, events=200, seed=43)  # generated objects and string payloads
    settings = ColumnsSettings(keep_payload=False)
    with DemoFeedServer(feed, dialect="published") as server:
        publish(feed, FIRST, partition=0)
        unparseable = add_odd_events(feed, partition=1)
        first = make_loader(server, payload_form="columns", columns=settings).sync()
        publish(feed, SECOND, partition=1)  # 12.5 and "n/a" in a BIGINT column, an object in a STRING field
        make_loader(server, payload_form="columns", columns=settings).sync()
        sent = {(pid, position): text for pid in (0, 1) for position, text in enumerate(feed.published(pid))}
        assert assert_columns_are_the_payload(spark, table_path, unparseable, sent=sent) == {1: 2}
        assert {pid: r.unparsed_payloads for pid, r in first.items()} == {0: 0, 1: len(unparseable)}
        frame = spark.read.format("delta").load(table_path)
        # every event once: each of its positions, nothing more
        assert frame.select("partition_id", "position").distinct().count() == frame.count() == len(sent)
        kept = {
            r.payload_type: r["count"]
            for r in frame.where("payload IS NOT NULL").groupBy("payload_type").count().collect()
        }
        assert kept["object"] == len(unparseable) and kept["string"] > 0
        assert frame.where("payload IS NULL").count() == len(sent) - sum(kept.values())


def test_a_frozen_contract_fails_a_load_that_brings_a_new_field_and_commits_nothing(spark, make_loader, table_path):
    feed = DemoFeed(partitions=2, events=0, seed=42)
    frozen = ColumnsSettings(evolution="freeze", declared={"created": "TIMESTAMP", "amount": "DECIMAL(12,2)"})
    with DemoFeedServer(feed, dialect="published") as server:
        publish(feed, [{"id": "f-1", "amount": 1.25, "created": "2026-11-28T10:00:00Z"}], partition=0)
        publish(feed, [{"id": "f-2", "amount": "x", "created": "not a time"}], partition=1)
        make_loader(server, payload_form="columns", columns=frozen).sync()  # the first load makes the schema
        types = column_types(spark, table_path)
        assert types["created"] == "timestamp" and types["amount"] == "decimal(12,2)" and types["id"] == "string"
        # declared types are cast; a value Spark cannot cast is rescued
        rows = {r.id: r for r in spark.read.format("delta").load(table_path).collect()}
        assert str(rows["f-1"].amount) == "1.25" and rows["f-1"].created is not None
        assert json.loads(rows["f-2"]["_rescued_data"]) == {"amount": "x", "created": "not a time"}

        version = len(history(spark, table_path))
        publish(feed, [{"id": "f-3", "amount": 2}], partition=0)
        publish(feed, [{"id": "f-4", "amount": 3, "discount": 0.5}], partition=1)
        with pytest.raises(PayloadSchemaFrozen, match=r"payload key 'discount' \(a new key, first in partition 1\)"):
            make_loader(server, payload_form="columns", columns=frozen).sync()
        assert len(history(spark, table_path)) == version  # nothing committed
        # rescue: the same load goes through, the new key kept in `_rescued_data`
        make_loader(server, payload_form="columns", columns=ColumnsSettings(evolution="rescue")).sync()
        assert "discount" not in column_types(spark, table_path)
        rows = {r.id: r for r in spark.read.format("delta").load(table_path).collect()}
        assert json.loads(rows["f-4"]["_rescued_data"]) == {"discount": 0.5}
    assert_every_event_once(spark, table_path, feed, exactly_once=True)


@pytest.mark.parametrize(
    ("rebuild_key", "sync_key", "rebuild_column"),
    [("from_rebuild", "from_sync", "from_rebuild"), ("Amount", "amount", "Amount_1")],
    ids=["two-keys", "keys-equal-but-for-case"],
)
def test_two_loads_that_add_columns_at_once_end_with_both(
    spark, make_loader, table_path, rebuild_key, sync_key, rebuild_column
):
    # A rebuild of partition 0 plans its columns; before it commits, a sync of partition 1 commits a column
    # of its own: the rebuild's commit is planned again on the schema that won, and both columns stay.
    # Keys equal but for case: the rebuild planned `Amount` as the name of its new column, but `amount`
    # committed first; had the rebuild's write merged its column into that one by name (Spark compares
    # names ignoring case), `Amount`'s values would be in `amount`'s column: planned again, it gets a name
    # of its own, and each column's key metadata stays its key.
    feed = DemoFeed(partitions=2, events=0, seed=43)
    with DemoFeedServer(feed, dialect="published") as server:
        publish(feed, [{"id": "r-1", "base": 1}], partition=0)
        publish(feed, [{"id": "s-1", "base": 2}], partition=1)
        make_loader(server, payload_form="columns").sync()
        publish(feed, [{"id": "r-2", rebuild_key: "yes"}], partition=0)
        publish(feed, [{"id": "s-2", sync_key: 7}], partition=1)
        rebuild = make_loader(server, payload_form="columns")
        table = rebuild.sink.table
        planned = table.payload_columns
        raced = []

        def payload_columns_then_another_load():
            found = planned()  # what the rebuild plans against
            if not raced:
                raced.append(make_loader(server, payload_form="columns").sync([1]))
            return found

        table.payload_columns = payload_columns_then_another_load
        rebuild.rebuild([0])
        assert raced
        types = column_types(spark, table_path)
        assert types[rebuild_column] == "string" and types[sync_key] == "bigint"
        assert assert_columns_are_the_payload(spark, table_path) == {}
    assert_every_event_once(spark, table_path, feed, exactly_once=True)


@ON_S3
def test_a_columns_feed_on_s3_lands_every_value_typed(spark, make_loader, table_path, lakehouse):
    feed = DemoFeed(partitions=2, events=120, seed=44)
    with DemoFeedServer(feed, dialect="published") as server:
        publish(feed, FIRST, partition=0)
        make_loader(server, payload_form="columns").sync()
        publish(feed, SECOND, partition=1)
        make_loader(server, payload_form="columns").sync()
    assert assert_columns_are_the_payload(spark, table_path) == {1: 2}
    assert_every_event_once(spark, table_path, feed, exactly_once=True, log=lakehouse.log(table_path))


def test_a_thousand_fields_are_a_thousand_columns(spark, make_loader, table_path):
    feed = DemoFeed(partitions=1, events=0, seed=46)
    wide = [{f"field {j}": i * 1000 + j for j in range(1000)} for i in range(3)]
    with DemoFeedServer(feed, dialect="published") as server:
        publish(feed, wide, partition=0)
        make_loader(server, payload_form="columns").sync()
    types = column_types(spark, table_path)
    assert {f"field_{j}" for j in range(1000)} <= set(types) and types["field_999"] == "bigint"
    assert assert_columns_are_the_payload(spark, table_path) == {}
