"""A feed run as a stream from Dagster (`feedapi_<feed>_stream`), and switched between batch loads and
streams: one cursor of record, every event once, the materializations mirroring the table's cursors."""

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

from feedapi_dagster.demo.faults import Faults
from feedapi_dagster.lakehouse.cursor_record import read_committed_state
from feedapi_dagster.orchestration import SparkResource, build_feedapi_definitions
from feedapi_dagster.orchestration.config import ScheduleConfig
from feedapi_dagster.spark.settings import SparkSettings

from .test_flow import assert_exactly_once


def stream(harness, raise_on_error=True, **config) -> dg.ExecuteInProcessResult:
    job = harness.defs.resolve_job_def(f"feedapi_{harness.name}_stream")
    result = job.execute_in_process(
        run_config={"ops": {f"feedapi_{harness.name}_stream_op": {"config": config}}},
        instance=harness.instance,
        raise_on_error=raise_on_error,
    )
    harness.runs.append(result)
    return result


@contextmanager
def publishing(harness) -> Iterator[None]:
    """10 events appended to the feed every 0.5 s while the block runs."""
    stop = threading.Event()

    def publish():
        while not stop.wait(0.5):
            harness.feed.append(10)

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        yield
    finally:
        stop.set()
        publisher.join()


def load(harness) -> dg.ExecuteInProcessResult:
    (request,) = harness.tick_schedule().run_requests
    result = harness.launch(request)
    assert result.success
    return result


def run_log(harness, result) -> list[str]:
    """The run's log lines, as its page in the UI shows them."""
    return [entry.user_message for entry in harness.instance.all_logs(result.run_id)]


def materialized(result) -> dict[str, dict]:
    events = result.get_asset_materialization_events()
    return {e.partition: {k: v.value for k, v in e.materialization.metadata.items()} for e in events}


def test_a_feed_switched_between_batch_loads_and_streams_lands_every_event_once(spark, harness):
    harness.tick_sensor()
    load(harness)  # batch
    harness.feed.append(90)
    run = stream(harness, catch_up=False)  # availableNow micro-batches, from the batch load's cursors
    assert run.success
    state = read_committed_state(harness.log).state
    done = materialized(run)
    assert set(done) == {"0", "1", "2"}  # every partition the micro-batches moved
    for key, metadata in done.items():  # the cursor of record, mirrored
        assert metadata["cursor"] == state.get(int(key)).cursor
        assert metadata["position"] == state.get(int(key)).position
    assert sum(m["events"] for m in done.values()) == 90
    assert_exactly_once(spark, harness, [0, 1, 2])

    harness.feed.append(60)
    harness.feed.close(1)
    load(harness)  # batch again, from the stream's cursors
    assert_exactly_once(spark, harness, [0, 1, 2])
    assert stream(harness, catch_up=False).success  # nothing new: no micro-batch, nothing materialized
    assert materialized(harness.runs[-1]) == {}

    logs = run_log(harness, harness.runs[-1])
    assert any("stream started (available_now" in m and "from the cursor of record" in m for m in logs)


def test_a_processing_time_stream_picks_up_events_as_they_are_published(spark, harness):
    harness.tick_sensor()
    with publishing(harness):
        run = stream(harness, trigger="processing_time", interval_seconds=1, run_seconds=12)
    assert run.success
    logs = run_log(harness, run)
    batches = [m for m in logs if "micro-batch" in m and "ran in" in m]
    assert len(batches) >= 3, logs  # several triggers, each logged with where its seconds went
    assert any("run_seconds (12) passed" in m for m in logs)
    stream(harness)  # what was published after the last trigger
    assert_exactly_once(spark, harness, [0, 1, 2])


def test_a_failing_stream_fails_its_run_clearly_and_the_next_run_continues(spark, harness):
    harness.tick_sensor()
    harness.server.faults = Faults(1.0, kinds=("500",), retry_after=0)  # every fetch fails
    run = stream(harness, raise_on_error=False, catch_up=False)
    assert not run.success
    failure = run.failure_data_for_node(f"feedapi_{harness.name}_stream_op")
    assert failure is not None and failure.error is not None
    assert "the stream failed" in failure.error.message and "500" in failure.error.message
    harness.server.faults = None
    assert stream(harness).success
    assert_exactly_once(spark, harness, [0, 1, 2])


def test_the_stream_job_catches_up_by_a_batch_load_then_streams_from_the_cursor_it_committed(spark, harness):
    harness.tick_sensor()
    harness.server.faults = Faults(1.0, kinds=("500",), retry_after=0)  # the catch-up's fetches fail
    failed = stream(harness, raise_on_error=False, trigger="processing_time", interval_seconds=1, run_seconds=5)
    assert not failed.success
    error = failed.failure_data_for_node(f"feedapi_{harness.name}_stream_op").error
    assert "could not be loaded" in error.message and "500" in error.message
    assert not any("stream started" in m for m in run_log(harness, failed))  # no query after a failed catch-up
    harness.server.faults = None

    backlog = sum(p.position for p in read_committed_state(harness.log).state.partitions.values())
    harness.feed.append(300)
    with publishing(harness):
        run = stream(harness, trigger="processing_time", interval_seconds=1, run_seconds=10)
    assert run.success
    logs = run_log(harness, run)
    caught_up = next(m for m in logs if "caught up by a batch load" in m)
    assert "partitions [0, 1, 2]" in caught_up
    assert int(re.search(r"caught up by a batch load: (\d+) events", caught_up)[1]) >= backlog + 300
    started = next(i for i, m in enumerate(logs) if "stream started (processing_time" in m)
    assert logs.index(caught_up) < started  # the query starts from the commit the catch-up left
    assert [m for m in logs[started:] if "micro-batch" in m and "ran in" in m], logs  # then micro-batches
    before = sum(p.position for p in read_committed_state(harness.log).state.partitions.values())

    harness.feed.append(30)  # and what was published after the last trigger
    run = stream(harness)  # available_now: the catch-up is the whole run, no query
    assert run.success
    after = sum(p.position for p in read_committed_state(harness.log).state.partitions.values())
    assert sum(m["events"] for m in materialized(run).values()) == after - before >= 30
    assert not any("stream started" in m for m in run_log(harness, run))
    assert_exactly_once(spark, harness, [0, 1, 2])


def test_in_stream_mode_the_schedule_runs_the_stream_job(spark, harness):
    feed = harness.feed_config.model_copy(update={"schedule": ScheduleConfig(mode="stream")})
    project = harness.project.model_copy(update={"feeds": [feed]})
    defs = build_feedapi_definitions(project, spark=SparkResource(settings=SparkSettings(mode="local")))
    schedule = defs.resolve_schedule_def("feedapi_orders_schedule")
    assert schedule.job_name == "feedapi_orders_stream"
    with dg.build_schedule_context(instance=harness.instance) as context:
        (request,) = schedule.evaluate_tick(context).run_requests
    assert request.run_config == {}  # availableNow, the job's default
    sensor = defs.resolve_sensor_def("feedapi_orders_discovery")
    with dg.build_sensor_context(instance=harness.instance, definitions=defs) as context:
        result = sensor(context)
    assert not result.run_requests  # the stream reads new partitions itself
    assert result.dynamic_partitions_requests  # they still become the asset's partitions
