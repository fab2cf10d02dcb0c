"""`feedapi-dagster sql` and `sql_session()`: SQL on a dg project's feed tables by their feeds' names, as
a data engineer looks at a loaded table (issue 49), run in the project's folder as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from feedapi_dagster.demo.feedapi.demo_feed import DemoFeed
from feedapi_dagster.demo.feedapi.server import DemoFeedServer
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.lakehouse.loader import FeedLoader
from feedapi_dagster.lakehouse.sink import DeltaSink
from feedapi_dagster.protocol import feed_settings

from ..user_project import importable, write_user_project

pytestmark = pytest.mark.spark


@pytest.fixture
def loaded_project(spark, tmp_path, monkeypatch):
    """A user's dg project (local Spark) whose `orders` table is loaded (120 events in 2 partitions) in
    its own folder's `lakehouse/`, and a second feed `refunds` with no table yet."""
    root = tmp_path / "project"
    feed = DemoFeed(partitions=2, events=120, seed=49)
    with DemoFeedServer(feed) as server:
        write_user_project(root, server.url, {"mode": "local"}, lakehouse=root / "lakehouse")
        FeedLoader(
            feed_settings(url=server.url, token="tok-sql"),
            DeltaSink(FeedTable(spark, str(root / "lakehouse" / "orders"))),
        ).sync()
    defs = root / "user_project" / "defs" / "feeds" / "defs.yaml"
    component = yaml.safe_load(defs.read_text())
    feeds = component["attributes"]["feeds"]
    feeds.append({**feeds[0], "name": "refunds"})
    defs.write_text(yaml.safe_dump(component, sort_keys=False))
    monkeypatch.setenv("ORDERS_FEED_TOKEN", "tok-sql")
    with importable(root):
        yield root, feed


def _sql(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    command = [str(Path(sys.executable).parent / "feedapi-dagster"), "sql", *args]
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_sql_prints_a_query_on_a_feed_table_named_by_its_feed(loaded_project):
    root, feed = loaded_project
    found = _sql(
        root, "SELECT partition_id, count(*) AS events, max(position) AS last FROM orders GROUP BY 1 ORDER BY 1"
    )
    assert found.returncode == 0, found.stderr[-3000:]
    rows = re.findall(r"^\|\s*(\d+)\|\s*(\d+)\|\s*(\d+)\|$", found.stdout, re.M)
    counted = {int(partition): (int(events), int(last)) for partition, events, last in rows}
    assert sorted(counted) == [0, 1] and sum(events for events, _ in counted.values()) == 120, found.stdout
    assert all(last == events - 1 for events, last in counted.values()), found.stdout
    assert found.stdout.splitlines()[1] == "|partition_id|events|last|", found.stdout
    # the feed that has loaded nothing yet is said, once, on stderr
    assert "no table yet (nothing loaded) for: refunds" in found.stderr, found.stderr[-2000:]


def test_sql_takes_a_tables_folder_relative_to_the_project_where_delta_needs_the_table(loaded_project):
    root, _ = loaded_project
    found = _sql(root, "DESCRIBE HISTORY delta.`lakehouse/orders`", "--truncate", "20")
    assert found.returncode == 0, found.stderr[-3000:]
    assert re.search(r"^\|\s*1\|", found.stdout, re.M), found.stdout  # the rows' commit, version 1


def test_a_statement_spark_refuses_is_its_first_line_and_exit_code_1(loaded_project):
    root, _ = loaded_project
    found = _sql(root, "SELECT no_such_column FROM orders")
    assert found.returncode == 1
    said = found.stderr.strip().splitlines()[-1]
    assert said.startswith("[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with name"), (
        said
    )
    assert "Traceback" not in found.stderr


def test_sql_session_is_the_projects_session_with_its_feed_tables(loaded_project, spark):
    from feedapi_dagster import sql_session

    root, _ = loaded_project
    session = sql_session(root)
    assert session.sql("SELECT count(*) AS n FROM orders").collect()[0]["n"] == 120


PAGE = "docs/getting-started/look-at-the-data.md"


def test_the_look_at_the_data_pages_blocks_run_in_a_loaded_project(loaded_project, spark, monkeypatch):
    """docs/getting-started/look-at-the-data.md as written: its shell block by bash in the project's folder,
    its Python blocks in one namespace there; then delta-rs's read of a `columns` table too, as it says."""
    from tests.docs.test_doc_blocks import REPO, blocks_of

    root, _ = loaded_project
    blocks = blocks_of(REPO / PAGE)
    assert [b.lang for b in blocks] == ["bash", "text", "python", "python"], [b.lang for b in blocks]
    env = {**os.environ, "PYTHONPATH": str(root), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    shell = subprocess.run(
        ["bash", "-ec", blocks[0].body], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert shell.returncode == 0, shell.stderr[-3000:]
    assert shell.stdout.count("+\n|") == 6, shell.stdout  # three tables printed (a header and rows each)
    said = _sql(root, "SELECT no_such_column FROM orders").stderr.strip().splitlines()[-1]
    assert said.startswith(blocks[1].body.split("[...]")[0].strip()), said
    monkeypatch.chdir(root)
    namespace: dict = {}
    for block in blocks[2:]:
        exec(compile(block.body, f"{PAGE}:{block.line}", "exec"), namespace)
    assert namespace["rows"].num_rows == 120
    columns = root / "lakehouse" / "columns_orders"
    with DemoFeedServer(DemoFeed(partitions=2, events=60, seed=49)) as server:
        FeedLoader(
            feed_settings(url=server.url), DeltaSink(FeedTable(spark, str(columns), payload_form="columns"))
        ).sync()
    from deltalake import DeltaTable

    typed = DeltaTable(str(columns)).to_pyarrow_table()
    assert typed.num_rows == 60 and "data_1" in typed.column_names, typed.column_names
