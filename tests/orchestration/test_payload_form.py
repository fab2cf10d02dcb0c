"""A feed with `payload_form: variant` through Dagster: batch loads and the feed's stream job of a FeedAPI
feed, and a Nakadi event type. Every row's `data` is compared with its payload (objects, a string, numbers,
null, nested objects and arrays, and two payloads Spark's parser refuses: NULL, their text kept), the
asset shows the `data` column, and an analyst's query reads fields by path. The payloads Spark could not
parse are counted: the materializations' `unparsed_payloads`, a warning in the run, the `payloads_parsed`
check (WARN) fails."""

import json

import dagster as dg
import pytest

from feedapi_dagster.demo.nakadi import NakadiDemoServer, NakadiEventType

from ..lakehouse.conftest import add_odd_events, assert_data_is_the_payload, unparsed_rows
from .conftest import nakadi_harness
from .test_flow import assert_exactly_once, check_results
from .test_stream_job import materialized, run_log, stream

VARIANT = {"payload_form": "variant", "partitions": 2, "events": 150}


def columns(defs: dg.Definitions) -> list[tuple[str, str]]:
    (spec,) = defs.get_assets_def(dg.AssetKey(["feedapi", "orders"])).specs
    return [(c.name, c.type) for c in spec.metadata["dagster/column_schema"].columns]


@pytest.mark.parametrize("harness", [VARIANT], indirect=True)
def test_a_variant_feed_through_batch_loads_and_the_stream_job_parses_every_payload(spark, harness):
    assert columns(harness.defs)[-1] == ("data", "variant")
    unparseable = add_odd_events(harness.feed, partition=0)
    (request,) = harness.tick_sensor().run_requests
    run = harness.launch(request)
    assert run.success
    assert_exactly_once(spark, harness, [0, 1])
    assert assert_data_is_the_payload(spark, harness.table, unparseable) == 150 + 10

    # the payloads Spark could not parse, counted by the write job: as many as the table's rows with
    # `data` NULL and a payload, in the materializations, the run's log and the check (a warning)
    assert unparsed_rows(spark, harness.table) == {0: len(unparseable)} == {0: 2}
    counted = {e.partition: e.materialization.metadata["unparsed_payloads"].value for e in materialized_events(run)}
    assert counted == {"0": 2, "1": 0}
    warned = [line for line in run_log(harness, run) if "could not parse" in line]
    assert warned == [
        "feed orders partition 0: 2 payloads Spark could not parse: loaded with data NULL, their text in payload"
    ]
    assert check_results(run) == {
        "no_duplicate_event_ids": True,
        "positions_contiguous": True,
        "cursor_metadata_matches_delta": True,
        "payloads_parsed": False,
    }
    (parsed,) = [e for e in run.get_asset_check_evaluations() if e.check_name == "payloads_parsed"]
    assert parsed.severity is dg.AssetCheckSeverity.WARN
    assert parsed.metadata["unparsed_payloads"].value == {"0": 2}
    assert parsed.metadata["partitions_checked"].value == 2
    # the next load brings only parseable payloads: its check passes, its counts are 0
    harness.feed.append(10)
    run = harness.launch(harness.tick_schedule().run_requests[0])
    assert check_results(run)["payloads_parsed"] is True
    assert [e.materialization.metadata["unparsed_payloads"].value for e in materialized_events(run)] in (
        [0],
        [0, 0],
    )

    # an analyst's query: fields by path, no schema written by hand
    amounts = spark.sql(
        f"SELECT data:amount::int AS amount FROM delta.`{harness.table}` WHERE data:amount::int > 100"
    ).collect()
    rows = spark.read.format("delta").load(harness.table).where("payload_type = 'object'").collect()
    objects = [json.loads(r.payload) for r in rows]
    assert sorted(r.amount for r in amounts) == sorted(o["amount"] for o in objects if o.get("amount", 0) > 100)
    assert 150 in {r.amount for r in amounts}

    # the feed's stream job: its micro-batches commit through the same write
    harness.feed.append(40)
    unparseable += add_odd_events(harness.feed, partition=1, tag="-stream")
    run = stream(harness, catch_up=False)  # micro-batches
    assert run.success and materialized(run)
    assert_exactly_once(spark, harness, [0, 1])
    assert assert_data_is_the_payload(spark, harness.table, unparseable) == 150 + 10 + 10 + 40 + 10
    # the stream's micro-batches' unparsed payloads, counted in the table: materializations and a warning
    # (a partition's events may land in several micro-batches: a materialization each)
    counted: dict[str, int] = {}
    for event in materialized_events(run):
        counted[event.partition] = (
            counted.get(event.partition, 0) + event.materialization.metadata["unparsed_payloads"].value
        )
    assert counted == {"0": 0, "1": 2}
    warned = [line for line in run_log(harness, run) if "could not parse" in line]
    assert warned and all(line.startswith("feed orders partition 1: ") for line in warned)
    assert sum(int(line.split(": ")[1].split()[0]) for line in warned) == 2


def materialized_events(run: dg.ExecuteInProcessResult) -> list[dg.DagsterEvent]:
    return run.get_asset_materialization_events()


def test_a_nakadi_event_type_in_variant_form_parses_every_event(spark, instance, tmp_path):
    event_type = NakadiEventType(partitions=2, events=200, seed=43, duplicate_ratio=0.1)
    with NakadiDemoServer(event_type) as server:
        harness = nakadi_harness(event_type, server, instance, tmp_path, payload_form="variant")
        (request,) = harness.tick_sensor().run_requests
        assert harness.launch(request).success
        assert_exactly_once(spark, harness, [0, 1])
        assert assert_data_is_the_payload(spark, harness.table) == event_type.unique_count()
        # Nakadi's envelope by path: each row's event id is its metadata's eid
        query = f"SELECT count(*) FROM delta.`{harness.table}` WHERE data:metadata.eid::string = event_id"
        assert spark.sql(query).first()[0] == event_type.unique_count()
