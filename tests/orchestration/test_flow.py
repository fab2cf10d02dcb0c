"""Sensor ticks and the runs they request, against the demo server, a real Dagster instance in a
temporary DAGSTER_HOME, real Spark and Delta. After each step the table must hold every published
event exactly once, in order within each partition."""

import dagster as dg
import pytest

from feedapi_dagster.lakehouse.cursor_record import read_committed_state, read_history
from feedapi_dagster.orchestration.run_storage import listed_partitions

from ..lakehouse.conftest import create_partitioned_table, payloads, table_layout
from ..s3_server import TEST_CREDENTIALS
from .test_secrets import files_containing


def assert_exactly_once(spark, harness, partitions=None):
    state = read_committed_state(harness.log).state
    for partition in partitions or sorted(state.partitions):
        rows = payloads(spark, harness.table, partition)
        assert rows == harness.feed.expected_events(partition), f"partition {partition}"
        meta = harness.metadata(partition)
        if meta:  # the materialization mirrors the cursor of record
            assert meta["cursor"] == state.get(partition).cursor
            assert meta["position"] == state.get(partition).position == len(rows)


def test_discovery_appends_close_and_schedule(spark, harness):
    result = harness.tick_sensor()
    assert sorted(harness.instance.get_dynamic_partitions("feedapi_orders")) == ["0", "1", "2"]
    (request,) = result.run_requests
    run = harness.launch(request)
    assert run.success
    materialized = {e.partition for e in run.get_asset_materialization_events()}
    assert materialized == {"0", "1", "2"}  # one materialization per partition the run loaded
    planned = harness.instance.get_records_for_run(
        run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED
    ).records
    assert {r.event_log_entry.dagster_event.asset_key for r in planned} == {dg.AssetKey(["feedapi", "orders"])}
    metadata = harness.metadata(0)
    assert metadata["dagster/partition_row_count"] == metadata["position"] > 0
    assert metadata["dagster/row_count"] == sum(harness.metadata(p)["position"] for p in (0, 1, 2))
    assert_exactly_once(spark, harness, [0, 1, 2])
    assert harness.metadata(0)["dialect"] == "published" and harness.metadata(0)["events"] > 0

    # nothing changed: the sensor requests nothing, the same run key is not repeated
    assert not harness.tick_sensor().run_requests

    harness.feed.append(60)
    harness.feed.close(1)
    result = harness.tick_sensor()
    (request,) = result.run_requests  # a final run for the partition that closed
    assert request.tags["feedapi/partitions"] == "1"
    assert harness.launch(request).success
    assert harness.metadata(1)["drained"] is True

    schedule_requests = harness.tick_schedule().run_requests
    (request,) = schedule_requests
    assert request.tags["feedapi/partitions"] == "0,2"  # drained partition 1 is not due any more
    assert harness.launch(request).success
    assert_exactly_once(spark, harness, [0, 1, 2])

    # only partition 2 has new events: the schedule's run reads 0 and 2, materializes and checks 2
    harness.feed.append(5, partition=2)
    (request,) = harness.tick_schedule().run_requests
    run = harness.launch(request)
    assert run.success
    assert {e.partition for e in run.get_asset_materialization_events()} == {"2"}
    checked = [
        e.metadata["partitions_checked"].value
        for e in run.get_asset_check_evaluations()
        if "partitions_checked" in e.metadata
    ]
    assert checked and set(checked) == {1}
    assert_exactly_once(spark, harness, [0, 1, 2])


ON_S3 = {
    "lakehouse": "s3",
    "maintenance": {
        "optimize_every_commits": 2,
        "vacuum_every_commits": 2,
        "time_travel_hours": 0,
        "cron": "0 3 * * *",
    },
}


@pytest.mark.parametrize("harness", [ON_S3], indirect=True)
def test_the_flow_with_the_lakehouse_on_s3(spark, spark_work_dir, harness, tmp_path):
    """Discovery, loads, a method-2 split, a backfill rebuild and maintenance, the table on the S3
    server: the run process reads the log with delta-rs through the storage setting, Spark writes
    through s3a."""
    assert harness.table.startswith("s3a://")
    assert harness.launch(harness.tick_sensor().run_requests[0]).success
    assert_exactly_once(spark, harness, [0, 1, 2])
    table = harness.binding.table_for(spark)
    table.ensure_table()
    assert table.delta_log is not None  # the run reads the log with delta-rs, not through Spark
    parent_rows = payloads(spark, harness.table, 2)

    harness.feed.append(40, partition=2)
    children = harness.feed.split_method2(2, children=2)
    harness.feed.close(1)
    harness.feed.append(30)
    for request in harness.tick_sensor().run_requests:
        assert harness.launch(request).success
    harness.feed.append(25)
    run = harness.launch(harness.tick_schedule().run_requests[0])
    assert run.success and all(check.passed for check in run.get_asset_check_evaluations())
    maintenance = harness.defs.resolve_job_def("feedapi_orders_maintenance").execute_in_process(
        instance=harness.instance, resources={}
    )
    assert maintenance.success
    (seen,) = harness.instance.fetch_observations(dg.AssetKey(["feedapi", "orders"]), limit=1).records
    seen = {k: v.value for k, v in seen.asset_observation.metadata.items()}
    assert seen["maintenance"] == "OPTIMIZE, VACUUM" and seen["files_removed"] > 0  # deleted from S3

    before = read_committed_state(harness.log).delta_version
    assert harness.materialize_partition(1, tags={"dagster/backfill": "bf-s3"}).success
    assert harness.metadata(1)["rebuilt"] is True
    assert read_committed_state(harness.log).delta_version > before
    assert_exactly_once(spark, harness, [0, 1])
    assert payloads(spark, harness.table, 2) == parent_rows
    for child in children:  # the children went on from the parent's cursor
        assert payloads(spark, harness.table, child) == [
            e for e in harness.feed.published(child) if e not in set(parent_rows)
        ]
    secret = TEST_CREDENTIALS["FEEDAPI_TEST_S3_SECRET"].encode()  # in no run record, event or Spark file
    assert files_containing(tmp_path, secret) == [] and files_containing(spark_work_dir, secret) == []


def test_method1_split_children_after_parent_is_drained(spark, harness):
    harness.launch(harness.tick_sensor().run_requests[0])
    harness.feed.append(30, partition=0)  # not loaded yet when the split happens
    children = harness.feed.split_method1(0, children=2)
    harness.feed.append(80)
    (request,) = harness.tick_sensor().run_requests
    assert listed_partitions(request.tags) >= {0, *children}
    assert harness.launch(request).success
    assert_exactly_once(spark, harness, [0, *children])
    history = list(reversed(read_history(harness.table, limit=None).states))
    drained_at = next(h.delta_version for h in history if h.state.get(0) and h.state.get(0).drained)
    for child in children:
        # the first commit that read the child: a rows commit naming it pending, or one moving it
        first = next(
            h.delta_version
            for h in history
            if child in h.pending or (h.state.get(child) and h.state.get(child).position > 0)
        )
        assert drained_at < first, "a method-1 child was loaded before its parent was drained"


def test_method2_split_children_continue_from_the_parent_cursor(spark, harness):
    harness.launch(harness.tick_sensor().run_requests[0])
    parent_rows = payloads(spark, harness.table, 2)
    harness.feed.append(40, partition=2)
    children = harness.feed.split_method2(2, children=2)
    harness.feed.append(60)
    result = harness.tick_sensor()
    assert sorted(harness.instance.get_dynamic_partitions("feedapi_orders")) == sorted(
        ["0", "1", "2", *map(str, children)]
    )  # the vanished parent stays visible
    (request,) = result.run_requests
    assert harness.launch(request).success
    assert payloads(spark, harness.table, 2) == parent_rows  # history stays where it was loaded
    for child in children:
        rows = payloads(spark, harness.table, child)
        assert rows == [e for e in harness.feed.published(child) if e not in set(parent_rows)]
        assert harness.metadata(child)["start_cursor"] == read_committed_state(harness.table).state.get(2).cursor
    assert harness.launch(harness.tick_schedule().run_requests[0]).success
    assert_exactly_once(spark, harness, [0, 1])


@pytest.mark.parametrize("harness", [{"rebuild_on_split": True}], indirect=True)
def test_rebuild_after_a_method2_split(spark, harness):
    harness.launch(harness.tick_sensor().run_requests[0])
    children = harness.feed.split_method2(2, children=2)
    harness.feed.append(30)
    requests = harness.tick_sensor().run_requests
    rebuild = next(r for r in requests if r.tags.get("feedapi/rebuild") == "true")
    assert harness.launch(rebuild).success
    assert payloads(spark, harness.table, 2) == []  # the parent's rows were replaced by its children's
    for child in children:
        assert payloads(spark, harness.table, child) == harness.feed.published(child)
        assert harness.metadata(child)["rebuilt"] is True


def test_backfill_of_a_closed_partition_rebuilds_it_atomically(spark, harness):
    harness.feed.close(1)
    harness.launch(harness.tick_sensor().run_requests[0])
    before = read_committed_state(harness.table).delta_version
    result = harness.materialize_partition(1, tags={"dagster/backfill": "bf1"})
    assert result.success
    assert read_committed_state(harness.table).delta_version == before + 1
    assert harness.metadata(1)["rebuilt"] is True
    assert_exactly_once(spark, harness, [0, 1, 2])


def test_token_change_triggers_rediscovery_and_loading_goes_on(spark, harness):
    harness.launch(harness.tick_sensor().run_requests[0])
    old_token = harness.server.discovery_token
    harness.server.rotate_token()
    harness.feed.append(50)
    result = harness.tick_sensor()
    assert f'"token":"{harness.server.discovery_token}"' in result.cursor and old_token not in result.cursor
    (request,) = harness.tick_schedule().run_requests
    assert harness.launch(request).success
    assert_exactly_once(spark, harness, [0, 1, 2])


def test_a_second_load_of_a_busy_partition_refuses_to_start(spark, harness, instance):
    harness.launch(harness.tick_sensor().run_requests[0])
    job = harness.defs.resolve_job_def("feedapi_orders_load")
    # a run of the asset in progress that loads partition 0
    busy = instance.create_run_for_job(
        job, tags={"feedapi/feed": "orders", "feedapi/partitions": "0"}, status=dg.DagsterRunStatus.STARTED
    )
    with pytest.raises(dg.Failure, match="another run is loading it"):
        harness.materialize_partition(0)
    assert harness.tick_schedule().run_requests[0].tags["feedapi/partitions"] == "1,2"
    instance.report_run_canceled(busy)


def check_results(run: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {e.check_name: e.passed for e in run.get_asset_check_evaluations()}


def test_every_load_runs_the_checks_and_they_catch_a_stale_mirror(spark, harness):
    run = harness.launch(harness.tick_sensor().run_requests[0])
    # a FeedAPI server deletes no events on its own: no check of events expired unread (Nakadi's has one)
    assert check_results(run) == {
        "no_duplicate_event_ids": True,
        "positions_contiguous": True,
        "cursor_metadata_matches_delta": True,
    }
    asset = harness.defs.get_assets_def(dg.AssetKey(["feedapi", "orders"]))
    assert {key.name for key in asset.check_keys} == set(check_results(run))
    # a load committed to Delta but the run died before recording its materialization
    harness.feed.append(20, partition=0)
    from feedapi_dagster.lakehouse.feed_table import FeedTable
    from feedapi_dagster.lakehouse.loader import FeedLoader
    from feedapi_dagster.lakehouse.sink import DeltaSink

    FeedLoader(harness.feed_config.settings, DeltaSink(FeedTable(spark, harness.table))).sync([0])
    harness.feed.append(10, partition=1)
    # a load of partition 1 sees the stale mirror of partition 0 and records its cursor of record
    run = harness.launch(harness.tick_schedule().run_requests[0])
    assert check_results(run)["cursor_metadata_matches_delta"] is True
    assert_exactly_once(spark, harness, [0, 1, 2])


def test_a_violated_check_blocks_the_run(spark, harness):
    harness.launch(harness.tick_sensor().run_requests[0])
    # a row written behind the loader's back: partition 1 holds one event (and its position) twice
    spark.read.format("delta").load(harness.table).where("partition_id = 1 AND event_id IS NOT NULL").limit(
        1
    ).write.format("delta").mode("append").save(harness.table)
    harness.feed.append(10, partition=1)
    run = harness.launch(harness.tick_schedule().run_requests[0], raise_on_error=False)
    results = check_results(run)
    # the positions say it (file statistics); the id check of an exactly-once feed scans only the rows
    # this load added, among which no id repeats
    assert results["positions_contiguous"] is False and results["no_duplicate_event_ids"] is True
    assert not run.success  # blocking checks fail the run


def test_an_exactly_once_feed_that_sends_an_id_twice_fails_the_duplicate_check(spark, harness):
    harness.launch(harness.tick_sensor().run_requests[0])
    # the feed breaks its promise: one id in two events, one page apart (the read tasks count it)
    harness.feed.add_event('{"id": "twice-1", "n": 1}', partition=2)
    harness.feed.append(7, partition=2)
    harness.feed.add_event('{"id": "twice-1", "n": 2}', partition=2)
    run = harness.launch(harness.tick_schedule().run_requests[0], raise_on_error=False)
    evaluations = {e.check_name: e for e in run.get_asset_check_evaluations()}
    duplicate = evaluations["no_duplicate_event_ids"]
    assert duplicate.passed is False and evaluations["positions_contiguous"].passed is True
    assert duplicate.metadata["examples"].value == ["partition 2: 1 event id(s) sent more than once, e.g. twice-1"]
    assert not run.success  # blocking
    # written as sent: the rows are the feed's, each once at its own position
    rows = spark.read.format("delta").load(harness.table).where("event_id = 'twice-1'").collect()
    assert len(rows) == 2 and len({r.position for r in rows}) == 2


@pytest.mark.parametrize("layout", ["clustered", "partitioned"])
def test_a_users_delete_is_no_loss_but_rows_removed_otherwise_are(spark, harness, layout):
    """A GDPR erasure (a DELETE of events in the middle of a partition) passes the next loads'
    positions check; rows an overwrite outside the loader removed still fail it. In a new table
    (clustered by partition_id; delta-rs cannot write to it: the DELETE is Spark SQL's) and in a table
    partitioned by partition_id, as releases up to 0.1.0 created it (the DELETE is delta-rs's)."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable, write_deltalake

    if layout == "partitioned":
        create_partitioned_table(spark, harness.table)
    assert harness.launch(harness.tick_sensor().run_requests[0]).success
    if layout == "partitioned":
        DeltaTable(harness.table).delete("partition_id = 1 AND position IN (3, 4)")
    else:
        spark.sql(f"DELETE FROM delta.`{harness.table}` WHERE partition_id = 1 AND position IN (3, 4)")
    harness.feed.append(10, partition=1)
    run = harness.launch(harness.tick_schedule().run_requests[0])
    contiguous = {e.check_name: e for e in run.get_asset_check_evaluations()}["positions_contiguous"]
    assert run.success and contiguous.passed, contiguous.metadata["problems"].value
    assert contiguous.metadata["deleted_by_user"].value == {"1": 2}
    assert contiguous.metadata["deletes_exact"].value is True
    # the next load goes on from that count: the DELETE is counted once
    harness.feed.append(5, partition=1)
    run = harness.launch(harness.tick_schedule().run_requests[0])
    contiguous = {e.check_name: e for e in run.get_asset_check_evaluations()}["positions_contiguous"]
    assert run.success and contiguous.passed and contiguous.metadata["deleted_by_user"].value == {"1": 2}
    rows = spark.read.format("delta").load(harness.table).where("partition_id = 1")
    assert rows.count() == harness.metadata(1)["position"] - 2

    # partition 2's rows rewritten outside the loader, one of them left out: a loss, not a DELETE
    if layout == "partitioned":
        kept = DeltaTable(harness.table).to_pyarrow_table(filters=[("partition_id", "=", 2)])
        write_deltalake(
            harness.table,
            kept.filter(pc.not_equal(kept["position"], 3)),
            mode="overwrite",
            predicate="partition_id = 2",
        )
    else:
        kept = (
            spark.read.format("delta").load(harness.table).where("partition_id = 2 AND position != 3").localCheckpoint()
        )
        kept.write.format("delta").mode("overwrite").option("replaceWhere", "partition_id = 2").save(harness.table)
    harness.feed.append(5, partition=2)
    run = harness.launch(harness.tick_schedule().run_requests[0], raise_on_error=False)
    contiguous = {e.check_name: e for e in run.get_asset_check_evaluations()}["positions_contiguous"]
    assert not contiguous.passed and not run.success  # blocking
    position = harness.metadata(2)["position"]
    assert contiguous.metadata["problems"].value == [
        f"partition 2: {position - 1} rows at positions 0..{position - 1}, committed position {position}"
    ]
    partitions, clustering, _ = table_layout(spark, harness.table)
    assert (partitions, clustering) == ((["partition_id"], []) if layout == "partitioned" else ([], ["partition_id"]))
