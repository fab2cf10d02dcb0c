"""The rows users' DELETE commits removed, counted from a real Delta log (tables written with delta-rs,
as a user's tools would), in both layouts: partitioned by `partition_id` (a folder per partition,
counted from the log's statistics) and not partitioned (a clustered table's case: files hold many
partitions, counted from the `partition_id` column of the files a DELETE rewrote; delta-rs creates
no clustered table, and the readers treat every table that is not partitioned alike)."""

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake

from feedapi_dagster.lakehouse.cursor_record import encode
from feedapi_dagster.lakehouse.deletes import count_user_deletes
from feedapi_dagster.lakehouse.delta_log import DeltaLog
from feedapi_dagster.lakehouse.stats import PartitionStats
from feedapi_dagster.planning import FeedState


def rows(partition: int, positions: range) -> pa.Table:
    return pa.table(
        {
            "partition_id": pa.array([partition] * len(positions), pa.int32()),
            "position": pa.array(list(positions), pa.int64()),
        }
    )


@pytest.fixture(params=["partitioned", "clustered"])
def layout(request):
    return request.param


def make_table(path: Path, layout: str) -> str:
    write_deltalake(str(path), rows(0, range(10)), partition_by=["partition_id"] if layout == "partitioned" else None)
    write_deltalake(str(path), rows(1, range(10)), mode="append")
    assert DeltaLog(str(path)).partitioned() == (layout == "partitioned")
    return str(path)


def test_deletes_are_counted_per_partition_and_carried_on(tmp_path, layout):
    table = make_table(tmp_path / "t", layout)
    DeltaTable(table).delete("partition_id = 0 AND position IN (3, 4)")
    log = DeltaLog(table)
    counted = count_user_deletes(log)
    assert dict(counted.rows) == {0: 2} and counted.exact and counted.version == 2

    write_deltalake(table, rows(1, range(10, 15)), mode="append")  # a load's append: nothing deleted
    DeltaTable(table).delete("position = 7")  # one row in each partition
    carried = count_user_deletes(log, counted)
    assert dict(carried.rows) == {0: 3, 1: 1} and carried.exact and carried.version == 4
    assert count_user_deletes(log) == carried  # the same as a count from the whole log


def test_a_restore_takes_the_count_back_and_a_loads_rebuild_starts_it_again(tmp_path, layout):
    table = make_table(tmp_path / "t", layout)
    DeltaTable(table).delete("partition_id = 0 AND position = 3")  # version 2
    DeltaTable(table).delete("partition_id = 1 AND position = 3")  # version 3
    log = DeltaLog(table)
    before_restore = count_user_deletes(log)
    DeltaTable(table).restore(2)  # the second DELETE undone: its row is back
    assert dict(count_user_deletes(log).rows) == {0: 1}
    assert dict(count_user_deletes(log, before_restore).rows) == {0: 1}

    # a load rebuilds partition 0 from its start (its overwrite carries the feed state and names the
    # partitions it replaced): no row is missing
    write_deltalake(
        table,
        rows(0, range(10)),
        mode="overwrite",
        predicate="partition_id = 0",
        commit_properties=CommitProperties(
            custom_metadata={"userMetadata": encode(FeedState(), "load-1", None, replaced=(0,))}
        ),
    )
    assert dict(count_user_deletes(log).rows) == {}
    # an overwrite that is not a load's is no rebuild: the count stays
    DeltaTable(table).delete("partition_id = 1 AND position = 5")
    write_deltalake(table, rows(1, range(10)), mode="overwrite", predicate="partition_id = 1")
    assert dict(count_user_deletes(log).rows) == {1: 1}


def test_a_cleaned_up_log_makes_the_count_inexact_unless_it_is_carried_on(tmp_path, layout):
    table = make_table(tmp_path / "t", layout)
    DeltaTable(table).delete("partition_id = 0 AND position = 3")
    carried = count_user_deletes(DeltaLog(table))
    write_deltalake(table, rows(1, range(10, 12)), mode="append")
    DeltaTable(table).create_checkpoint()
    for commit in ("00000000000000000000.json", "00000000000000000001.json", "00000000000000000002.json"):
        (tmp_path / "t" / "_delta_log" / commit).unlink()  # Delta's log cleanup behind the checkpoint

    fresh = count_user_deletes(DeltaLog(table))
    assert not fresh.exact and dict(fresh.rows) == {}  # the DELETE before the log's oldest commit is unknown
    went_on = count_user_deletes(DeltaLog(table), carried)
    assert went_on.exact and dict(went_on.rows) == {0: 1}


def test_the_positions_check_with_deleted_rows():
    after_delete = PartitionStats(rows=8, min_position=0, max_position=9)
    assert after_delete.contiguous(10, deleted_by_user=2)
    assert not after_delete.contiguous(10)  # two rows lost
    assert not after_delete.contiguous(10, deleted_by_user=1)  # one deleted, one lost
    assert after_delete.contiguous(10, deleted_by_user=1, deletes_exact=False)  # unknown DELETEs: fewer accepted
    assert not after_delete.contiguous(8, deletes_exact=False)  # but not a position past the committed one
    assert not PartitionStats(rows=11, min_position=0, max_position=9).contiguous(10, deletes_exact=False)
    assert PartitionStats(0, None, None).contiguous(2, deleted_by_user=2)  # every row deleted


def test_a_clustered_tables_delete_is_counted_from_the_files_it_rewrote(tmp_path):
    """Files of many partitions: the DELETE's own files are read, the others are not."""
    table = str(tmp_path / "t")
    write_deltalake(table, pa.concat_tables([rows(0, range(10)), rows(1, range(10))]))  # one file, 2 partitions
    write_deltalake(table, rows(2, range(10)), mode="append")  # a file the DELETE leaves alone
    DeltaTable(table).delete("position = 3 AND partition_id < 2")
    counted = count_user_deletes(DeltaLog(table))
    assert dict(counted.rows) == {0: 1, 1: 1} and counted.exact

    # a load's overwrite that does not name the partitions it replaced (a clustered table's files hold
    # other partitions' rows too): which partitions start again is not known
    write_deltalake(
        table,
        rows(0, range(10)),
        mode="overwrite",
        predicate="partition_id = 0",
        commit_properties=CommitProperties(custom_metadata={"userMetadata": encode(FeedState(), "load-1", None)}),
    )
    went_on = count_user_deletes(DeltaLog(table), counted)
    assert not went_on.exact and dict(went_on.rows) == {0: 1, 1: 1}


def test_a_clustered_tables_delete_whose_files_were_vacuumed_is_not_exact(tmp_path):
    table = str(tmp_path / "t")
    write_deltalake(table, pa.concat_tables([rows(0, range(10)), rows(1, range(10))]))
    DeltaTable(table).delete("partition_id = 0 AND position = 3")
    DeltaTable(table).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    counted = count_user_deletes(DeltaLog(table))
    assert not counted.exact and dict(counted.rows) == {}
