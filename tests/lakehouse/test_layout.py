"""The feed table's layout (issue #26): a new table is clustered by `partition_id` (liquid clustering),
and a table created partitioned by it (releases up to 0.1.0) keeps its layout and loads as before. Both
go through the same loads: appends, a user's DELETE, an at-least-once feed's dedup against the stored
ids, a rebuild (`replaceWhere` on `partition_id`), OPTIMIZE, and the positions check after each (the
statistics and the count of users' DELETEs, read by delta-rs from the log or from the two columns)."""

import shutil
from pathlib import Path

import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.errors import LayoutMismatch
from feedapi_dagster.lakehouse.cursor_record import METADATA_KEY, read_committed_state
from feedapi_dagster.lakehouse.deletes import UserDeletes, count_user_deletes
from feedapi_dagster.lakehouse.delta_log import DeltaLog
from feedapi_dagster.lakehouse.feed_table import create_table_sql
from feedapi_dagster.lakehouse.load_settings import LoadSettings
from feedapi_dagster.lakehouse.stats import NO_ROWS, PartitionStats, partition_stats

from .conftest import LOG_READERS, create_partitioned_table, payloads, table_layout


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


# ----------------------------------------------------------------------------- an operator's own tools
# delta-rs's refusal of a clustered table, as the README quotes it (issue #35)
DELTA_RS_REFUSAL = (
    r"Unsupported table features required: \[(ClusteredTable, DomainMetadata|DomainMetadata, ClusteredTable)\]"
)


def positioned(path) -> dict[int, list[tuple[int, str]]]:
    """Each partition's rows (position, payload) in position order, read by delta-rs (milliseconds)."""
    rows = DeltaTable(path).to_pyarrow_table(columns=["partition_id", "position", "payload"]).to_pylist()
    table: dict[int, list[tuple[int, str]]] = {}
    for row in sorted(rows, key=lambda r: (r["partition_id"], r["position"])):
        table.setdefault(row["partition_id"], []).append((row["position"], row["payload"]))
    return table


@pytest.mark.parametrize("layout", ["partitioned", "none"])
def test_an_operators_delta_rs_delete_compaction_and_restore_keep_the_cursor_of_record(
    spark, make_loader, table_path, layout
):
    """An operator's GDPR DELETE, compaction and RESTORE by delta-rs on a table whose layout delta-rs
    writes: each commits, and each next load (a run's: a new loader reading the cursor of record)
    brings every event once, the erased ones excepted."""
    feed = DemoFeed(partitions=3, events=120, seed=43)
    erased: dict[int, set[int]] = {}

    def expected(partition: int) -> list[tuple[int, str]]:
        events = enumerate(feed.expected_events(partition))
        return [(position, payload) for position, payload in events if position not in erased.get(partition, ())]

    with DemoFeedServer(feed, dialect="published") as server:

        def load(settings=None):
            loader = make_loader(server, page_size_hint=40, layout=layout, settings=settings)
            loader.sync()
            assert positioned(table_path) == {partition: expected(partition) for partition in range(3)}
            return loader.sink.table

        # two Spark jobs, two commits: two files of each partition for the compaction
        table = load(LoadSettings(max_events_per_partition=25))
        assert table.found_layout() == layout
        partitions, clustering, _ = table_layout(spark, table_path)
        assert (partitions, clustering) == ((["partition_id"] if layout == "partitioned" else []), [])

        # a GDPR erasure and a compaction (a commit that changes no row), then a load
        assert DeltaTable(table_path).delete("partition_id = 1 AND position IN (3, 4)")["num_deleted_rows"] == 2
        erased[1] = {3, 4}
        assert DeltaTable(table_path).optimize.compact()["numFilesRemoved"] > 0
        before = DeltaTable(table_path).version()
        state_before = read_committed_state(DeltaLog(table_path)).state
        feed.append(60)
        table = load()
        deletes = positions_check(spark, table, None)
        assert dict(deletes.rows) == {1: 2} and deletes.exact

        # a RESTORE to the version before that load: its rows and cursors are undone, the next load reads
        # them again
        DeltaTable(table_path).restore(before)
        assert read_committed_state(DeltaLog(table_path)).state == state_before
        table = load()
        deletes = positions_check(spark, table, deletes)
        assert dict(deletes.rows) == {1: 2} and deletes.exact

    operations = {h["operation"]: h.get("engineInfo", "") for h in DeltaTable(table_path).history()}
    assert all(operations[op].startswith("delta-rs") for op in ("DELETE", "OPTIMIZE", "RESTORE")), operations


def test_delta_rs_refuses_a_clustered_table_and_the_readme_quotes_it(spark, make_loader, table_path):
    """delta-rs 1.6 writes no clustered table: its DELETE, compaction, append and RESTORE are refused
    with the error the README quotes (where it says to use Spark SQL instead: Spark's DELETE and
    OPTIMIZE of a clustered table between loads are `test_both_layouts_...` above, its RESTORE is
    `test_durable_state.py`'s), and commit nothing."""
    feed = DemoFeed(partitions=2, events=40, seed=44)
    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server, layout="clustered").sync()
    operator = DeltaTable(table_path)
    version = operator.version()
    refused = {
        "delete": lambda: operator.delete("partition_id = 1 AND position = 3"),
        "compact": operator.optimize.compact,
        "append": lambda: write_deltalake(table_path, operator.to_pyarrow_table(), mode="append"),
        "restore": lambda: operator.restore(version - 1),
    }
    for name, write in refused.items():
        with pytest.raises(CommitFailedError, match=DELTA_RS_REFUSAL):
            write()
        assert DeltaTable(table_path).version() == version, name
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "CommitFailedError: Unsupported table features required: [DomainMetadata, ClusteredTable]" in readme


@LOG_READERS
def test_a_table_found_with_another_layout_is_one_line_and_not_loaded(spark, lakehouse, table_path, read_log):
    create_partitioned_table(spark, table_path)
    reader = "spark" if read_log == "spark" else "auto"
    with pytest.raises(LayoutMismatch) as raised:
        lakehouse.feed_table(spark, table_path, read_log=reader, layout="clustered").ensure_table()
    assert str(raised.value) == (
        f"the Delta table {table_path} is partitioned (PARTITIONED BY (partition_id)) and the feed's layout is "
        "clustered: a table's layout cannot change in place. Set `layout: partitioned` (or leave it unset) to go "
        'on loading this table, or move it to clustered as the README\'s "Table layout" says (a copy whose first '
        "commit carries the cursor of record)"
    )
    assert DeltaTable(table_path).version() == 0  # nothing written to it
    # its own layout, or none set: loaded as it is
    for layout in ("partitioned", None):
        lakehouse.feed_table(spark, table_path, read_log=reader, layout=layout).ensure_table()

    other = lakehouse.table("other")
    lakehouse.feed_table(spark, other, read_log=reader, layout="none").ensure_table()
    with pytest.raises(LayoutMismatch, match=r"is none \(no layout\) and the feed's layout is clustered"):
        lakehouse.feed_table(spark, other, read_log=reader, layout="clustered").ensure_table()


def test_a_table_moved_to_another_layout_as_the_readme_says_keeps_its_cursor_of_record(spark, make_loader, table_path):
    """The README's move of a clustered table to `none` (so that delta-rs can write it): the rows copied
    aside, the table created anew with the layout, the rows inserted back in one commit carrying the
    cursor of record. The next load goes on from it: every event once."""
    feed = DemoFeed(partitions=2, events=80, seed=45)
    aside = f"{table_path}-aside"
    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server, layout="clustered").sync()
        state = read_committed_state(DeltaLog(table_path)).state

        # the README's steps (the feed's schedule and sensor off, no load running)
        record = next(
            h["userMetadata"] for h in DeltaTable(table_path).history() if METADATA_KEY in (h.get("userMetadata") or "")
        )
        spark.sql(f"CREATE TABLE delta.`{aside}` USING delta AS SELECT * FROM delta.`{table_path}`")
        shutil.rmtree(table_path)
        spark.sql(create_table_sql(table_path, "none"))
        spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", record)
        try:
            spark.sql(f"INSERT INTO delta.`{table_path}` SELECT * FROM delta.`{aside}`")
        finally:
            spark.conf.unset("spark.databricks.delta.commitInfo.userMetadata")

        assert DeltaLog(table_path).layout() == "none"
        assert read_committed_state(DeltaLog(table_path)).state == state
        feed.append(40)
        make_loader(server, layout="none").sync()
    events = {partition: list(enumerate(feed.expected_events(partition))) for partition in range(2)}
    assert positioned(table_path) == events
