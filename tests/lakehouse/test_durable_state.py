"""The cursor of record outlives what a Delta table lives through for years: log cleanup at any
retention (classic and v2 checkpoints), OPTIMIZE, VACUUM, RESTORE and users' own commits. Real Spark,
real Delta, real HTTP; time passes as Delta's log cleanup sees it (the log files' modification times)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.errors import StateError
from feedapi_dagster.lakehouse.commit import AFTER_COMMIT, BEFORE_COMMIT
from feedapi_dagster.lakehouse.cursor_record import REASSERT_AFTER_COMMITS, read_committed_state
from feedapi_dagster.lakehouse.feed_table import Commit, FeedTable
from feedapi_dagster.read.datasource import EVENT_DDL

from .conftest import table_rows

FIXTURES = Path(__file__).parent / "fixtures"
DAY = 86400


def log_files(lakehouse, path: str) -> list[str]:
    return [name for name in lakehouse.names(f"{path}/_delta_log") if name[:1].isdigit()]


def last_checkpoint(lakehouse, path: str) -> int:
    try:
        return json.loads(lakehouse.read(f"{path}/_delta_log/_last_checkpoint"))["version"]
    except FileNotFoundError:
        return -1


def user_commit(spark, path: str, n: int) -> None:
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('team.note' = 'n{n}')").collect()


def let_time_pass(spark, lakehouse, path: str, days: float, *, until_gone: int) -> int:
    """Others' commits while `days` pass, until Delta's log cleanup has removed the commit `until_gone`.

    Delta deletes commit files older than `delta.logRetentionDuration` when it writes a checkpoint, and
    only up to an older checkpoint: commits are made until a checkpoint lies past `until_gone`, every
    log file before it is aged by `days` (its modification time, on disk or on the S3 server), and
    commits go on until the next checkpoint cleans up."""
    n = 0
    while last_checkpoint(lakehouse, path) <= until_gone:
        user_commit(spark, path, n)
        n += 1
    boundary = last_checkpoint(lakehouse, path)
    lakehouse.age(
        f"{path}/_delta_log", [name for name in log_files(lakehouse, path) if int(name[:20]) < boundary], days * DAY
    )
    while last_checkpoint(lakehouse, path) == boundary:
        user_commit(spark, path, n)
        n += 1
    assert f"{until_gone:020d}.json" not in log_files(lakehouse, path), "Delta's log cleanup did not run"
    return n


def state_command(path: str, *options: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "feedapi_dagster.cli", "state", path, *options],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def gdpr_delete(spark, path: str, partition: int) -> str:
    """A user's DELETE of one event in the middle of a partition; its payload."""
    rows = table_rows(spark, path, partition)
    victim = rows[len(rows) // 2]
    spark.sql(f"DELETE FROM delta.`{path}` WHERE partition_id = {partition} AND position = {victim.position}").collect()
    return victim.payload


# the default retention with classic checkpoints, a 1-day retention with v2 checkpoints; on S3 too
@pytest.mark.parametrize(
    "retention_days, policy, lakehouse",
    [(30, "classic", "local"), (1, "v2", "local"), (1, "classic", "s3")],
    indirect=["lakehouse"],
)
def test_the_next_load_is_exactly_once_after_log_cleanup_maintenance_and_users_commits(
    spark, make_loader, lakehouse, table_path, retention_days, policy
):
    feed = DemoFeed(partitions=2, events=60, seed=31)
    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server, page_size_hint=9).sync()
        table = lakehouse.feed_table(spark, table_path)
        before = read_committed_state(table)
        assert before.source == "commit"
        spark.sql(
            f"ALTER TABLE delta.`{table_path}` SET TBLPROPERTIES ("
            f"'delta.logRetentionDuration' = 'interval {retention_days} days', "
            f"'delta.deletedFileRetentionDuration' = 'interval {retention_days} days', "
            f"'delta.checkpointPolicy' = '{policy}')"
        ).collect()
        deleted = gdpr_delete(spark, table_path, 0)
        table.optimize()
        table.vacuum(0, 4)  # the files before OPTIMIZE and the DELETE go
        let_time_pass(spark, lakehouse, table_path, retention_days + 2, until_gone=before.delta_version)

        recovered = read_committed_state(lakehouse.feed_table(spark, table_path))
        assert recovered.source == "rows" and recovered.delta_version is None
        assert {pid: p.position for pid, p in recovered.state.partitions.items()} == {
            pid: p.position for pid, p in before.state.partitions.items()
        }
        if policy == "v2":  # delta-rs cannot open it: the operator's command reads it with Spark
            shown = state_command(table_path)
            assert "recovered from the rows" in shown
            assert all(p.cursor in shown for p in recovered.state.partitions.values())

        feed.append(40)

        # the first load after the cleanup fails right before its commit: nothing is lost by that either
        def fail_before_commit(moment, updates):
            if moment == BEFORE_COMMIT:
                raise RuntimeError("killed before the commit")

        with pytest.raises(RuntimeError, match="killed before the commit"):
            make_loader(server, page_size_hint=9, on_moment=fail_before_commit).sync()
        assert read_committed_state(lakehouse.feed_table(spark, table_path)).source == "rows"
        make_loader(server, page_size_hint=9).sync()
        after = read_committed_state(lakehouse.feed_table(spark, table_path))
        assert after.source == "commit"  # the state is in the log again
    for partition in (0, 1):
        rows = table_rows(spark, table_path, partition)
        expected = [p for p in feed.published(partition) if not (partition == 0 and p == deleted)]
        assert [r.payload for r in rows] == expected
        assert after.state.get(partition).position == rows[-1].position + 1
        assert after.state.get(partition).cursor == rows[-1].cursor


def test_a_quiet_open_partitions_sync_carries_the_state_to_the_head_in_one_commit_without_rows(
    spark, make_loader, table_path
):
    # An open partition is read at every sync; with nothing new, the read's own commit (no row) carries
    # the state at the head, and no state commit follows it.
    feed = DemoFeed(partitions=1, events=20, seed=31)
    with DemoFeedServer(feed, dialect="draft") as server:
        make_loader(server).sync()
        first = read_committed_state(table_path)
        user_commit(spark, table_path, 1)
        make_loader(server).sync()
    quiet = read_committed_state(table_path)
    assert (quiet.delta_version, quiet.source, quiet.pending) == (first.delta_version + 2, "commit", ())
    assert quiet.state.partitions == first.state.partitions
    assert [r.payload for r in table_rows(spark, table_path, 0)] == feed.published(0)


def test_a_quiet_feed_commits_its_state_again_before_others_commits_can_bury_it(spark, make_loader, table_path):
    # A drained partition is not read again: a sync of the feed commits nothing, until others' commits
    # push the state's commit far back
    feed = DemoFeed(partitions=1, events=20, seed=32)
    feed.close(0)
    with DemoFeedServer(feed, dialect="draft") as server:
        make_loader(server).sync()
        first = read_committed_state(table_path)
        assert first.state.get(0).drained
        for n in range(REASSERT_AFTER_COMMITS - 1):
            user_commit(spark, table_path, n)
        moments: list[tuple[str, dict]] = []

        def seen(moment: str, updates: dict) -> None:
            moments.append((moment, updates))

        make_loader(server, on_moment=seen).sync()  # nothing new, the state's commit is still near the head
        assert read_committed_state(table_path).delta_version == first.delta_version
        assert moments == []
        user_commit(spark, table_path, 99)
        make_loader(server, on_moment=seen).sync()
        # the commit of the state again is a commit as any other: its dangerous moments are reported
        assert moments == [(BEFORE_COMMIT, {}), (AFTER_COMMIT, {})]
    again = read_committed_state(table_path)
    assert again.delta_version == first.delta_version + REASSERT_AFTER_COMMITS + 1
    assert again.state.partitions == first.state.partitions
    assert [r.payload for r in table_rows(spark, table_path, 0)] == feed.published(0)


def test_after_a_restore_the_next_load_reloads_what_the_restore_took_out(spark, make_loader, table_path):
    feed = DemoFeed(partitions=2, events=30, seed=33)
    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server, page_size_hint=8).sync()
        restore_to = read_committed_state(table_path).delta_version
        for _ in range(2):
            feed.append(15)
            make_loader(server, page_size_hint=8).sync()
        user_commit(spark, table_path, 1)
        spark.sql(f"RESTORE TABLE delta.`{table_path}` TO VERSION AS OF {restore_to}").collect()
        restored = read_committed_state(table_path)
        assert restored.delta_version == restore_to
        feed.append(5)
        make_loader(server, page_size_hint=8).sync()
    for partition in (0, 1):
        rows = table_rows(spark, table_path, partition)
        assert [r.payload for r in rows] == feed.published(partition)
        assert [r.position for r in rows] == list(range(len(rows)))


def test_a_table_whose_state_is_gone_and_rows_deleted_is_refused_with_what_to_do(
    spark, make_loader, lakehouse, table_path
):
    feed = DemoFeed(partitions=1, events=20, seed=34)
    with DemoFeedServer(feed, dialect="draft") as server:
        make_loader(server).sync()
        state_version = read_committed_state(table_path).delta_version
        spark.sql(
            f"ALTER TABLE delta.`{table_path}` SET TBLPROPERTIES ("
            "'delta.logRetentionDuration' = 'interval 1 days', "
            "'delta.deletedFileRetentionDuration' = 'interval 1 days')"
        ).collect()
        spark.sql(f"DELETE FROM delta.`{table_path}`").collect()
        let_time_pass(spark, lakehouse, table_path, 3, until_gone=state_version)
        with pytest.raises(StateError) as error:
            make_loader(server).sync()
    message = str(error.value)
    assert table_path in message and "no rows" in message and "remove the table" in message
    assert spark.read.format("delta").load(table_path).count() == 0  # nothing was read from `_first`


def test_an_unreadable_state_is_an_error_naming_its_commit(spark, make_loader, table_path):
    feed = DemoFeed(partitions=1, events=10, seed=35)
    with DemoFeedServer(feed, dialect="draft") as server:
        make_loader(server).sync()
        head = read_committed_state(table_path).table_version
        broken = json.dumps({"feedapi_dagster": {"partitions": "not a map"}})
        FeedTable(spark, table_path).write(Commit(spark.createDataFrame([], EVENT_DDL), broken, 100), None)
        with pytest.raises(StateError, match=rf"commit {head + 1} cannot be read"):
            make_loader(server).sync()


def test_a_table_written_by_the_previous_release_keeps_loading(spark, make_loader, tmp_path):
    # tests/lakehouse/fixtures/table-0.1.0: written by release 0.1.0 (state in commit metadata,
    # txnVersion = the state's generation) from this feed: 2 partitions, 30 events, then 12 more
    path = str(tmp_path / "table")
    shutil.copytree(FIXTURES / "table-0.1.0", path)
    feed = DemoFeed(partitions=2, events=30, seed=11)
    feed.append(12)
    for partition in (0, 1):
        assert [r.payload for r in table_rows(spark, path, partition)] == feed.published(partition)
    old = read_committed_state(path)
    assert old.source == "commit" and old.state.generation == 2
    shown = json.loads(state_command(path, "--json"))
    assert shown["source"] == "commit" and shown["delta_version"] == 2
    assert shown["partitions"]["0"] == {
        "cursor": "c000000000029",
        "position": 26,
        "drained": False,
        "inherited_from": None,
    }
    feed.append(25)
    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server, path=path, page_size_hint=7).sync()
    new = read_committed_state(path)
    # one commit: its rows, with its state whose partitions end at their newest rows
    assert new.state.generation == 3 and new.delta_version == old.delta_version + 1 and new.ends_from_rows == (0, 1)
    for partition in (0, 1):
        rows = table_rows(spark, path, partition)
        assert [r.payload for r in rows] == feed.published(partition)
        assert [r.position for r in rows] == list(range(len(rows)))
