"""A user's protocol reaches the Python workers of a Spark Connect server that cannot import it: the
server was started by another process (the test run's `connect_server`), whose environment does not
have the user's package, which lives in a folder only the loading process has on its path (as a
Dagster project's `definitions.py` imports it). The load sends the package's sources to the session
(`artifacts.protocol_zip`), each load of a process again (the same name and bytes: accepted); a
second process, after an edit of the module, sends them under another name into the same server-side
session (every client of the embedded server joins one), as a cluster's client (`mode: remote`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from feedapi_dagster.spark.connect_server import SparkConnectServer

from ..protocol.test_third_protocol import JsonLinesServer, events
from .conftest import payloads

THIRD_PROTOCOL = Path(__file__).parents[1] / "protocol" / "third_protocol.py"

LOAD = textwrap.dedent("""
    import json, sys
    projects, settings, url, table = sys.argv[1:5]
    sys.path.insert(0, projects)  # the user's project: on this process's path only
    import user_protocols.jsonlines  # registers "jsonlines", as the user's definitions.py does
    from feedapi_dagster.lakehouse.feed_table import FeedTable
    from feedapi_dagster.lakehouse.loader import FeedLoader
    from feedapi_dagster.spark.sessions import spark_session
    from feedapi_dagster.lakehouse.sink import DeltaSink
    from feedapi_dagster.spark.settings import SparkSettings
    from feedapi_dagster.protocol import feed_settings

    spark = spark_session(SparkSettings.model_validate_json(settings))
    feed = feed_settings(protocol="jsonlines", url=url, stream="orders", page_size_hint=10)
    sink = DeltaSink(FeedTable(spark, table))
    FeedLoader(feed, sink)  # a load before this one in the session: the same zip again is no error
    reports = FeedLoader(feed, sink).sync()
    print(json.dumps({p: [r.events, r.error] for p, r in reports.items()}))
""")


def load(projects: Path, settings: dict, url: str, table: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", LOAD, str(projects), json.dumps(settings), url, str(table)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    # the data source's error from the workers, else what the JVM's stack trace ends with
    imported = [line for line in proc.stderr.splitlines() if "cannot be imported here" in line]
    assert proc.returncode == 0, imported[0] if imported else proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_users_protocol_reaches_the_workers_of_a_server_that_cannot_import_it(
    spark, connect_server: SparkConnectServer, tmp_path: Path
) -> None:
    projects = tmp_path / "project"
    package = projects / "user_protocols"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    shutil.copy(THIRD_PROTOCOL, package / "jsonlines.py")
    table = tmp_path / "lakehouse" / "orders"
    stream = events(partitions=2, count=30)
    with JsonLinesServer({"orders": stream}) as server:
        embedded = {"mode": "embedded", "port": connect_server.port}
        assert load(projects, embedded, server.url, table) == {"0": [30, None], "1": [30, None]}
        for partition in (0, 1):
            assert [json.loads(row)["id"] for row in payloads(spark, str(table), partition)] == [
                event["id"] for event in stream[partition]
            ]

        # the user edits the module (another zip: the session has the first one under its name), the
        # feed grows, and a cluster's client of the same server-side session loads on
        (package / "jsonlines.py").write_text((package / "jsonlines.py").read_text() + "\n# edited\n")
        stream[1].extend({"id": f"1-{n}", "n": n} for n in range(30, 40))
        remote = {"mode": "remote", "remote": connect_server.client_url(), "ship_package": False}
        assert load(projects, remote, server.url, table) == {"0": [0, None], "1": [10, None]}
    assert len(payloads(spark, str(table), 1)) == 40
