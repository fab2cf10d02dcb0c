"""What a Dagster user sees of a sync with nothing new: a partition asked for by name (the UI's
"Materialize", a backfill) is materialized with what it is, a scheduled sync of every open partition
is one observation of the asset (when it was synced, what it brought), and the run's log says which
Spark ran it and where its UI is. Real runs in a Dagster instance, real Spark and Delta."""

import dagster as dg

from feedapi_dagster.lakehouse.cursor_record import read_committed_state

KEY = dg.AssetKey(["feedapi", "orders"])


def sync_observations(harness, run) -> list[dict]:
    """The observations of the asset that the run logged for its sync, their metadata."""
    records = harness.instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION).records
    return [
        {k: v.value for k, v in r.asset_observation.metadata.items()}
        for r in records
        if "last_synced" in r.asset_observation.metadata
    ]


def messages(harness, run) -> list[str]:
    return [entry.user_message for entry in harness.instance.all_logs(run.run_id)]


def test_a_quiet_sync_is_one_observation_and_a_partition_asked_for_is_materialized(spark, harness):
    first = harness.launch(harness.tick_sensor().run_requests[0])
    assert first.success
    (seen,) = sync_observations(harness, first)
    assert seen["partitions_synced"] == 3 and seen["partitions_with_new_events"] == 3
    assert seen["events_loaded"] == sum(len(harness.feed.published(p)) for p in range(3))
    assert "events_behind" not in seen  # a FeedAPI discovery does not say where a partition ends
    assert (
        "Spark: a local session in this process; Spark UI: off (spark.ui.enabled is false in the Spark "
        "settings' conf; set it to true for one)" in messages(harness, first)
    )
    metadata = harness.metadata(0)
    assert "events_per_second" not in metadata  # a partition's rate said nothing true of the load
    assert 0 < metadata["read_seconds"] <= metadata["load_seconds"]
    assert metadata["status"] == "loaded"

    # the schedule's sync with nothing new: no materialization, one observation, whatever the partitions
    sync = harness.launch(harness.tick_schedule().run_requests[0])
    assert sync.success and not sync.get_asset_materialization_events()
    (seen,) = sync_observations(harness, sync)
    assert seen["partitions_synced"] == 3 and seen["partitions_with_new_events"] == seen["events_loaded"] == 0
    assert seen["last_synced"] >= harness.instance.get_run_record_by_id(sync.run_id).start_time
    assert harness.instance.fetch_observations(KEY, limit=1).records[0].run_id == sync.run_id

    # "Materialize" of partition 1 in the UI: up to date, and materialized as such
    state = read_committed_state(harness.log)
    run = harness.materialize_partition(1)
    assert run.success
    (event,) = run.get_asset_materialization_events()
    assert event.partition == "1"
    metadata = harness.metadata(1)
    assert metadata["status"] == "up to date: nothing new" and metadata["events"] == 0
    assert metadata["cursor"] == state.state.get(1).cursor and metadata["position"] == state.state.get(1).position
    assert metadata["delta_version"] == read_committed_state(harness.log).delta_version >= state.delta_version
