"""A Nakadi event type through the whole Dagster flow: the discovery sensor (a repartitioning adds
dynamic partitions), the schedule, a backfill run, over a wire with faults and Nakadi's at-least-once
duplicates, against the bundled Nakadi server with a bearer token, a real Dagster instance, real
Spark and Delta, the feed configured in a defs.yaml. After each step every event is in the table exactly once, in offset order. And
what the load does when Nakadi's retention drops events before they were read."""

from pathlib import Path

import dagster as dg
import pytest

from feedapi_dagster.demo import Faults
from feedapi_dagster.demo.nakadi import NakadiDemoServer, NakadiEventType, parse_offset
from feedapi_dagster.lakehouse.cursor_record import read_committed_state
from feedapi_dagster.orchestration import FeedConfig, ProjectConfig
from feedapi_dagster.orchestration.automation import load_request
from feedapi_dagster.orchestration.checks import NO_DUPLICATES, NO_RETENTION_GAP
from feedapi_dagster.spark.settings import SparkSettings

from ..lakehouse.conftest import payloads
from ..user_project import importable, write_user_project
from .conftest import Harness
from .test_secrets import files_containing
from .test_sync_status import sync_observations

TOKEN_ENV, TOKEN = "NAKADI_FLOW_TOKEN", "nakadi-flow-secret-7f3a"


def assert_exactly_once(spark, harness: Harness, partitions=None):
    state = read_committed_state(harness.log).state
    for partition in partitions or sorted(state.partitions):
        rows = payloads(spark, harness.table, partition)
        assert rows == harness.feed.expected_events(partition), f"partition {partition}"
        assert harness.metadata(partition)["cursor"] == state.get(partition).cursor
        assert state.get(partition).position == len(rows)


def build(parts, load: dict) -> Harness:
    """The feed as a user configures it: a defs.yaml of their `dg` project (`protocol: nakadi`), its
    Definitions loaded as their code location loads them."""
    event_type, server, instance, root = parts
    feed = {
        "protocol": "nakadi",
        "url": server.url,
        "event_type": event_type.name,
        "dialect": None,
        "page_size_hint": 30,
        "token": f"{{{{ env.{TOKEN_ENV} }}}}",
        "load": load,
        "retry": {"max_attempts": 30, "base_delay": 0.001, "max_delay": 0.01},
    }
    write_user_project(root / "project", server.url, {"mode": "local"}, lakehouse=root / "lakehouse", feed=feed)
    with importable(root / "project"):
        defs = dg.load_from_defs_folder(path_within_project=root / "project")
    # the same feed, for the harness's paths and the table's log
    project = ProjectConfig(
        lakehouse=str(root / "lakehouse"),
        spark=SparkSettings(mode="local"),
        feeds=[
            FeedConfig(
                name="orders", protocol="nakadi", url=server.url, event_type=event_type.name, token_env=TOKEN_ENV
            )
        ],
    )
    return Harness(event_type, server, project, defs, instance)


@pytest.fixture
def nakadi_parts(spark, instance, tmp_path, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    event_type = NakadiEventType(partitions=3, events=300, seed=41, duplicate_ratio=0.1)
    with NakadiDemoServer(event_type, token=TOKEN) as server:
        yield event_type, server, instance, tmp_path


def test_the_flow_on_a_nakadi_event_type_with_faults_and_duplicates(spark, spark_work_dir, nakadi_parts):
    harness = build(nakadi_parts, {})
    harness.server.faults = Faults(0.3, seed=4, retry_after=0)
    (request,) = harness.tick_sensor().run_requests
    assert sorted(harness.instance.get_dynamic_partitions("feedapi_orders"), key=int) == ["0", "1", "2"]
    run = harness.launch(request)
    assert run.success
    assert_exactly_once(spark, harness, [0, 1, 2])
    assert harness.metadata(0)["protocol"] == "nakadi" and "dialect" not in harness.metadata(0)
    assert sum(harness.metadata(p)["duplicates_skipped"] for p in (0, 1, 2)) > 0  # Nakadi's repeats, dropped
    assert all(e.passed for e in run.get_asset_check_evaluations())

    harness.feed.append(120)
    (request,) = harness.tick_schedule().run_requests
    assert harness.launch(request).success
    assert_exactly_once(spark, harness, [0, 1, 2])

    # a repartitioning: the sensor adds the new partitions, and their run reads them from BEGIN
    assert harness.feed.repartition(5) == [3, 4]
    harness.feed.append(150)
    (request,) = harness.tick_sensor().run_requests
    assert request.tags["feedapi/partitions"] == "3,4"
    assert sorted(harness.instance.get_dynamic_partitions("feedapi_orders"), key=int) == ["0", "1", "2", "3", "4"]
    assert harness.launch(request).success
    (request,) = harness.tick_schedule().run_requests
    assert harness.launch(request).success
    assert_exactly_once(spark, harness, [0, 1, 2, 3, 4])

    # a backfill of a partition: Nakadi partitions never close, so it loads on from the cursor of record
    harness.feed.append(40)
    result = harness.materialize_partition(2, tags={"dagster/backfill": "nakadi-backfill"})
    assert result.success
    assert_exactly_once(spark, harness, [2])
    assert sum(harness.server.fault_counts.values()) > 0
    checks = [e for run in harness.runs for e in run.get_asset_check_evaluations()]
    assert checks and all(e.passed for e in checks if e.check_name == NO_DUPLICATES)
    assert not files_containing(Path(harness.instance.root_directory), TOKEN.encode())
    assert not files_containing(spark_work_dir, TOKEN.encode())


def test_events_expired_unread_stop_the_partition_until_the_loss_is_accepted(spark, nakadi_parts):
    harness = build(nakadi_parts, {})
    event_type = harness.feed
    (request,) = harness.tick_sensor().run_requests
    run = harness.launch(request)
    assert run.success
    (seen,) = sync_observations(harness, run)
    assert seen["events_behind"] == 0  # caught up with the newest offsets Nakadi lists
    loaded = payloads(spark, harness.table, 0)
    cursor = harness.metadata(0)["cursor"]

    event_type.append(300)
    event_type.expire(0, keep_last=5)  # retention: partition 0's new events but 5 are gone, unread
    oldest = next(p["oldest_available_offset"] for p in event_type.partitions() if p["partition"] == "0")
    (request,) = harness.tick_schedule().run_requests
    run = harness.launch(request, raise_on_error=False)
    assert not run.success  # the run says so, and the check names the partition and the offsets
    (gap,) = [e for e in run.get_asset_check_evaluations() if e.check_name == NO_RETENTION_GAP]
    assert not gap.passed
    (named,) = gap.metadata["gaps"].value
    assert "partition 0" in named and cursor in named and oldest in named
    assert payloads(spark, harness.table, 0) == loaded and harness.metadata(0)["cursor"] == cursor  # it stays
    # the asset says how far behind the feed it is: partition 0's events after its cursor
    newest = next(p["newest_available_offset"] for p in event_type.partitions() if p["partition"] == "0")
    (seen,) = sync_observations(harness, run)
    assert seen["events_behind"] == parse_offset(newest) - parse_offset(cursor) > 0
    assert seen["partitions_failed"] == 1
    assert_exactly_once(spark, harness, [1, 2])  # the others loaded

    # the loss accepted: the partition reads on from the oldest event left; the check fails this once
    harness = build(nakadi_parts, {"retention_gap": "skip"})
    run = harness.launch(request)
    (gap,) = [e for e in run.get_asset_check_evaluations() if e.check_name == NO_RETENTION_GAP]
    assert not gap.passed and gap.severity == dg.AssetCheckSeverity.ERROR
    assert payloads(spark, harness.table, 0) == event_type.expected_events(0, loaded)
    event_type.append(30)
    (request,) = harness.tick_schedule().run_requests
    run = harness.launch(request)
    assert all(e.passed for e in run.get_asset_check_evaluations())
    held = payloads(spark, harness.table, 0)
    assert held == event_type.expected_events(0, loaded)

    # a rebuild would replace the rows with the few Nakadi still holds: it is refused, nothing replaced
    rebuild = load_request(harness.binding, [0], "rebuild", ["0", "1", "2"], rebuild=[0])
    run = harness.launch(rebuild, raise_on_error=False)
    assert not run.success
    assert "the server no longer holds every event the table has" in str(
        run.get_step_failure_events()[0].step_failure_data.error
    )
    assert payloads(spark, harness.table, 0) == held
