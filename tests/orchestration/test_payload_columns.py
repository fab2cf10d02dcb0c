"""A feed with `payload_form: columns` through Dagster: batch loads, then the feed's stream job, with a
producer that adds a field and sends a value that does not fit its column; and a Nakadi event type whose
JSON Schema declares the columns' types. Every typed value is compared with its event's JSON; the
materializations show the table's real columns, the columns each load added and the rows it rescued;
the run warns and the `payloads_parsed` check (WARN) fails where values were rescued."""

import json

import dagster as dg
import pytest

from feedapi_dagster.demo.nakadi import NakadiDemoServer, NakadiEventType

from ..lakehouse.conftest import assert_columns_are_the_payload
from .conftest import nakadi_harness
from .test_flow import assert_exactly_once, check_results
from .test_stream_job import materialized, run_log, stream

COLUMNS = {"payload_form": "columns", "partitions": 2, "events": 120}


def publish(feed, events, partition):
    for event in events:
        feed.add_event(json.dumps(event), partition=partition)


def schema_of(event: dg.DagsterEvent) -> dict[str, str]:
    schema = event.materialization.metadata["dagster/column_schema"].value
    return {column.name: column.type for column in schema.columns}


@pytest.mark.parametrize("harness", [COLUMNS], indirect=True)
def test_a_columns_feed_through_batch_loads_and_the_stream_job_types_every_value(spark, harness):
    (spec,) = harness.defs.get_assets_def(dg.AssetKey(["feedapi", "orders"])).specs
    assert spec.metadata["dagster/column_schema"].columns[-1].name == "_rescued_data"
    publish(harness.feed, [{"id": "c-1", "amount": 5, "note": "first"}], partition=0)
    (request,) = harness.tick_sensor().run_requests
    run = harness.launch(request)
    assert run.success
    assert_exactly_once(spark, harness, [0, 1])
    assert assert_columns_are_the_payload(spark, harness.table) == {}
    events = run.get_asset_materialization_events()
    assert {"amount", "note", "id", "type", "data_1", "_rescued_data"} <= set(schema_of(events[0]))
    assert schema_of(events[0])["amount"] == "bigint"
    assert "amount" in events[0].materialization.metadata["columns_added"].value
    assert check_results(run)["payloads_parsed"] is True

    # the producer adds a field and sends a float where the column is BIGINT: a new column in the commit,
    # the value rescued, a warning, the check fails (WARN)
    publish(harness.feed, [{"id": "c-2", "amount": 5.5, "channel": "web"}], partition=1)
    run = harness.launch(harness.tick_schedule().run_requests[0])
    assert run.success
    assert assert_columns_are_the_payload(spark, harness.table) == {1: 1}
    metadata = {e.partition: e.materialization.metadata for e in run.get_asset_materialization_events()}
    assert metadata["1"]["rescued_values"].value == 1 and metadata["1"]["columns_added"].value == ["channel"]
    assert schema_of(run.get_asset_materialization_events()[0])["channel"] == "string"
    warned = [line for line in run_log(harness, run) if "kept in _rescued_data" in line]
    assert warned == [
        "feed orders partition 1: 1 row has values that have no column or do not fit theirs: kept in _rescued_data"
    ]
    assert check_results(run)["payloads_parsed"] is False
    (parsed,) = [e for e in run.get_asset_check_evaluations() if e.check_name == "payloads_parsed"]
    assert parsed.severity is dg.AssetCheckSeverity.WARN and parsed.metadata["rescued_values"].value == {"1": 1}

    # an analyst's query: typed columns, no schema written by hand
    big = spark.sql(f"SELECT id FROM delta.`{harness.table}` WHERE amount >= 5 AND channel IS NULL").collect()
    assert [r.id for r in big] == ["c-1"]

    # the feed's stream job: its micro-batches are typed by the same write, a new field added there too
    harness.feed.append(40)
    publish(harness.feed, [{"id": "c-3", "amount": 7, "channel": "app", "stream_only": True}], partition=0)
    run = stream(harness, catch_up=False)  # micro-batches
    assert run.success and materialized(run)
    assert_exactly_once(spark, harness, [0, 1])
    assert assert_columns_are_the_payload(spark, harness.table) == {1: 1}
    row = spark.sql(f"SELECT stream_only FROM delta.`{harness.table}` WHERE id = 'c-3'").first()
    assert row.stream_only is True


def test_a_nakadi_event_type_declares_its_columns_types(spark, instance, tmp_path):
    event_type = NakadiEventType(partitions=2, events=150, seed=45, duplicate_ratio=0.1)
    with NakadiDemoServer(event_type) as server:
        # the feed's own declaration wins over the server's
        harness = nakadi_harness(
            event_type, server, instance, tmp_path, payload_form="columns", payload_columns={"declared": {"seq": "INT"}}
        )
        (request,) = harness.tick_sensor().run_requests
        assert harness.launch(request).success
        assert_exactly_once(spark, harness, [0, 1])
        types = {f.name: f.dataType.simpleString() for f in spark.read.format("delta").load(harness.table).schema}
        # the event type's JSON Schema: amount a number (DOUBLE even where every event sent an integer)
        assert types["amount"] == "double" and types["order_number"] == "string" and types["seq"] == "int"
        assert types["metadata"].startswith("struct<")  # Nakadi's envelope: inferred
        rows = spark.read.format("delta").load(harness.table).collect()
        assert len(rows) == event_type.unique_count()
        for row in rows:
            payload = json.loads(row.payload)
            assert row.amount == float(payload["amount"]) and row.seq == payload["seq"]
            assert row.metadata.eid == payload["metadata"]["eid"] == row.event_id
            assert row["_rescued_data"] is None
