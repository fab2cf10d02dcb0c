"""Delta maintenance with real Spark and Delta: OPTIMIZE and VACUUM after N commits, the time-travel
window kept, and VACUUM at the dangerous moment of a load (after its read, before its commit)."""

import datetime as dt
from pathlib import Path

import pytest

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.lakehouse.commit import READ
from feedapi_dagster.lakehouse.cursor_record import read_committed_state
from feedapi_dagster.lakehouse.delta_log import OPTIMIZE
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.lakehouse.maintenance import (
    VACUUM,
    MaintenanceSettings,
    due,
    maintain,
    vacuum_retention_hours,
)

from .conftest import payloads, table_rows

NOW = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)


def data_files(table_path: str) -> set[str]:
    """Parquet files of the table on disk (the folders of `_` names beside them are not the table's)."""
    return {
        str(p.relative_to(table_path))
        for p in Path(table_path).rglob("*.parquet")
        if not any(part.startswith("_") for part in p.relative_to(table_path).parts)
    }


def live_files(spark, table_path: str, version: int | None = None) -> set[str]:
    frame = spark.read.format("delta")
    if version is not None:
        frame = frame.option("versionAsOf", version)
    return {
        Path(f).relative_to(Path(table_path).resolve()).as_posix()
        for f in (p.replace("file://", "").replace("file:", "") for p in frame.load(table_path).inputFiles())
    }


def test_the_retention_covers_the_time_travel_window_and_every_running_load():
    settings = MaintenanceSettings(time_travel_hours=24)
    assert vacuum_retention_hours(settings, None, NOW) == 24
    assert vacuum_retention_hours(settings, NOW - dt.timedelta(hours=2), NOW) == 24
    # a load running for 30 h reads the version it started from: kept 30 h + the margin
    assert vacuum_retention_hours(settings, NOW - dt.timedelta(hours=30), NOW) == 31
    # no window: only a running load keeps anything; whole hours, rounded up (never cut short)
    none = MaintenanceSettings(time_travel_hours=0)
    assert vacuum_retention_hours(none, None, NOW) == 0
    assert vacuum_retention_hours(none, (NOW - dt.timedelta(minutes=1)).replace(tzinfo=None), NOW) == 2
    assert vacuum_retention_hours(MaintenanceSettings(time_travel_hours=0.2), None, NOW) == 1


def test_optimize_and_vacuum_after_n_commits_keep_every_row_and_cursor(spark, make_loader, table_path):
    settings = MaintenanceSettings(optimize_every_commits=4, vacuum_every_commits=4, time_travel_hours=0)
    feed = DemoFeed(partitions=2, events=40, seed=21)
    with DemoFeedServer(feed, dialect="draft") as server:
        loader = make_loader(server, page_size_hint=10)
        table = loader.sink.table
        for _ in range(3):
            loader.sync()
            feed.append(6)
        assert due(table, settings) == ()  # three commits so far
        loader.sync()
        assert due(table, settings) == (OPTIMIZE, VACUUM)
        state = read_committed_state(table_path)
        files = data_files(table_path)
        report = maintain(table, settings, None, due(table, settings))
        assert due(table, settings) == ()  # just ran
    assert report.retention_hours == 0 and report.files_removed and report.files_removed > 0
    # what is on disk is exactly what the table uses: the small files OPTIMIZE replaced are gone
    assert data_files(table_path) == live_files(spark, table_path) and len(data_files(table_path)) < len(files)
    after = read_committed_state(table_path)
    assert after.state == state.state and after.delta_version == state.delta_version
    assert after.rows_version == report.delta_version  # the rows of the state, in today's files
    for partition in (0, 1):
        assert payloads(spark, table_path, partition) == feed.published(partition)


def test_vacuum_keeps_every_version_of_the_time_travel_window(spark, make_loader, table_path):
    feed = DemoFeed(partitions=1, events=30, seed=22)
    with DemoFeedServer(feed, dialect="draft") as server:
        loader = make_loader(server, page_size_hint=10)
        loader.sync()
        first = read_committed_state(table_path).delta_version
        before = payloads(spark, table_path, 0)
        feed.append(10)
        loader.sync()
        report = maintain(loader.sink.table, MaintenanceSettings(time_travel_hours=1), None)
    assert report.retention_hours == 1 and report.files_removed == 0
    old = spark.read.format("delta").option("versionAsOf", first).load(table_path)
    assert [r.payload for r in old.where("partition_id = 0").orderBy("position").collect()] == before


def test_vacuum_at_the_dangerous_moment_of_a_load_loses_and_duplicates_nothing(spark, make_loader, table_path):
    """An at-least-once load reads the stored event ids (to deduplicate) at the version it started
    from, after its read and before its commit. Maintenance runs exactly then: given the load's start,
    VACUUM keeps that version's files and the load commits; not given it (a load Dagster does not
    know of), VACUUM deletes them, the load fails without committing, and the next load recovers.
    Either way every event is stored once."""
    settings = MaintenanceSettings(time_travel_hours=0)
    feed = DemoFeed(partitions=2, events=120, seed=23, exactly_once=False, duplicate_ratio=0.2)
    reports = []

    def maintenance_now(running_since):
        def on_moment(moment, _updates):
            if moment == READ:
                table = FeedTable(spark, table_path)
                table.ensure_table()
                reports.append(maintain(table, settings, running_since))

        return on_moment

    with DemoFeedServer(feed, dialect="draft") as server:
        for _ in range(2):  # two commits per partition: OPTIMIZE has files to rewrite
            make_loader(server, page_size_hint=15).sync()
            feed.append(30)
        started = dt.datetime.now(dt.UTC)
        guarded = make_loader(server, page_size_hint=15, on_moment=maintenance_now(started)).sync()
        assert all(r.error is None for r in guarded.values()), guarded
        assert reports[-1].retention_hours >= 1 and reports[-1].files_removed == 0
        for partition in (0, 1):
            assert payloads(spark, table_path, partition) == feed.expected_events(partition)

        feed.append(30)
        committed = read_committed_state(table_path).state
        with pytest.raises(Exception):  # noqa: B017 - Spark's missing-file error types vary
            make_loader(server, page_size_hint=15, on_moment=maintenance_now(None)).sync()
        assert reports[-1].retention_hours == 0 and reports[-1].files_removed > 0
        assert read_committed_state(table_path).state == committed  # nothing of the failed load
        make_loader(server, page_size_hint=15).sync()  # reads the stored rows in today's files
    for partition in (0, 1):
        rows = table_rows(spark, table_path, partition)
        assert [r.payload for r in rows] == feed.expected_events(partition)
        assert [r.position for r in rows] == list(range(len(rows)))
    assert data_files(table_path) == live_files(spark, table_path)
