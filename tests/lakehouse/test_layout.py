"""The feed table's layout (issue #26): a new table is clustered by `partition_id` (liquid clustering),
and a table created partitioned by it (releases up to 0.1.0) keeps its layout and loads as before. Both
go through the same loads: appends, a user's DELETE, an at-least-once feed's dedup against the stored
ids, a rebuild (`replaceWhere` on `partition_id`), OPTIMIZE, and the positions check after each (the
statistics and the count of users' DELETEs, read by delta-rs from the log or from the two columns)."""

from pathlib import Path

import pytest

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.lakehouse.cursor_record import read_committed_state
from feedapi_dagster.lakehouse.deletes import UserDeletes, count_user_deletes
from feedapi_dagster.lakehouse.delta import DeltaLog
from feedapi_dagster.lakehouse.stats import NO_ROWS, PartitionStats, partition_stats

from .conftest import create_partitioned_table, payloads, table_layout


def test_a_new_table_is_clustered_by_partition_id(spark, make_loader, table_path):
    feed = DemoFeed(partitions=3, events=200, seed=41)
    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server).sync()
    partitions, clustering, properties = table_layout(spark, table_path)
    assert (partitions, clustering) == ([], ["partition_id"])
    assert properties["delta.dataSkippingStatsColumns"] == "partition_id,position"
    assert not DeltaLog(table_path).partitioned()
    # no folder per feed partition: the data files are at the table's root
    assert not list(Path(table_path).glob("partition_id=*")) and list(Path(table_path).glob("part-*.parquet"))
    for partition in range(3):
        assert payloads(spark, table_path, partition) == feed.published(partition)


def positions_check(spark, table, deletes_before: UserDeletes | None) -> UserDeletes:
    """The load's positions check (`checks._contiguous`) over every partition, and its statistics
    against Spark's count of the rows."""
    state = read_committed_state(table.delta_log).state
    loaded = sorted(state.partitions)
    stats = partition_stats(table, loaded)
    deletes = count_user_deletes(table.delta_log, deletes_before)
    for partition in loaded:
        found = stats.get(partition, NO_ROWS)
        assert found.contiguous(
            state.get(partition).position, deletes.deleted(partition), deletes.exact_for(partition)
        ), (partition, found, deletes)
    counted = {
        r[0]: PartitionStats(r[1], r[2], r[3])
        for r in spark.sql(
            f"SELECT partition_id, count(*), min(position), max(position) FROM delta.`{table.path}` "
            "GROUP BY partition_id"
        ).collect()
    }
    assert stats == counted
    return deletes


@pytest.mark.parametrize("layout", ["clustered", "partitioned"])
def test_both_layouts_load_check_count_deletes_and_rebuild_alike(spark, make_loader, table_path, layout):
    if layout == "partitioned":
        create_partitioned_table(spark, table_path)
    feed = DemoFeed(partitions=3, events=300, seed=42, exactly_once=False, duplicate_ratio=0.1)
    with DemoFeedServer(feed, dialect="published") as server:
        loader = make_loader(server, page_size_hint=40)
        table = loader.sink.table
        loader.sync()
        deletes = positions_check(spark, table, None)
        assert dict(deletes.rows) == {} and deletes.exact

        # a user's erasure (Spark SQL: delta-rs writes no clustered table), then loads deduplicated
        # against the ids the table holds
        spark.sql(f"DELETE FROM delta.`{table_path}` WHERE partition_id = 1 AND position IN (3, 4)")
        feed.append(60)
        loader.sync()
        deletes = positions_check(spark, table, deletes)
        assert dict(deletes.rows) == {1: 2} and deletes.exact
        for partition in (0, 2):
            assert payloads(spark, table_path, partition) == feed.expected_events(partition)
        state = read_committed_state(table.delta_log).state
        last = table.last_rows(None, [0, 1, 2])
        assert {p: position for p, (position, _) in last.items()} == {p: state.get(p).position - 1 for p in (0, 1, 2)}

        # a rebuild replaces partition 1 (its erased rows come back from the feed): its count starts again
        reports = loader.rebuild([1])
        assert reports[1].rebuilt
        deletes = positions_check(spark, table, deletes)
        assert dict(deletes.rows) == {} and 1 in deletes.rewritten
        for partition in (0, 1, 2):
            assert payloads(spark, table_path, partition) == feed.expected_events(partition)

        table.optimize()
        feed.append(30)
        loader.sync()
        positions_check(spark, table, deletes)
        for partition in (0, 1, 2):
            assert payloads(spark, table_path, partition) == feed.expected_events(partition)

    partitions, clustering, _ = table_layout(spark, table_path)
    expected = (["partition_id"], []) if layout == "partitioned" else ([], ["partition_id"])
    assert (partitions, clustering) == expected  # an existing table keeps its layout
    assert DeltaLog(table_path).partitioned() == (layout == "partitioned")
