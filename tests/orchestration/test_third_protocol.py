"""A third protocol added from outside the package, loaded as a user would: their definitions.py
imports their protocol module (`tests/protocol/third_protocol.py`, which registers "jsonlines"), their
defs.yaml names `protocol: jsonlines` with its own setting (`stream`), and a run of the feed's asset
reads it through the `feedapi` data source (in Spark's Python workers, which import the module
themselves: `protocolModule`) into the Delta table with the cursor of record."""

import importlib
import json

from feedapi_dagster.lakehouse.cursor_record import read_committed_state
from feedapi_dagster.orchestration import FeedConfig, ProjectConfig
from feedapi_dagster.spark.settings import SparkSettings

from ..lakehouse.conftest import payloads
from ..protocol.test_third_protocol import JsonLinesServer, events
from ..user_project import MODULE, importable, write_user_project
from .conftest import Harness


def test_a_protocol_registered_by_the_users_package_loads_through_a_defs_yaml(spark, instance, tmp_path):
    stream = events(partitions=3, count=45)
    with JsonLinesServer({"orders": stream, "other": events(1, 5)}) as server:
        feed = {
            "protocol": "jsonlines",
            "url": server.url,
            "stream": "orders",
            "page_size_hint": 10,
            "dialect": None,
            "token": None,
        }  # FeedAPI's dialect and the token: not this feed's
        root = write_user_project(
            tmp_path / "project", server.url, {"mode": "local"}, lakehouse=tmp_path / "lakehouse", feed=feed
        )
        definitions = root / MODULE / "definitions.py"
        definitions.write_text(
            "import tests.protocol.third_protocol  # registers the jsonlines protocol\n" + definitions.read_text()
        )
        with importable(root):
            defs = importlib.import_module(f"{MODULE}.definitions").defs()
        project = ProjectConfig(
            lakehouse=str(tmp_path / "lakehouse"),
            spark=SparkSettings(mode="local"),
            feeds=[FeedConfig(name="orders", protocol="jsonlines", url=server.url, stream="orders")],
        )
        harness = Harness(None, server, project, defs, instance)

        (request,) = harness.tick_sensor().run_requests
        assert sorted(instance.get_dynamic_partitions("feedapi_orders"), key=int) == ["0", "1", "2"]
        run = harness.launch(request)
        assert run.success
        state = read_committed_state(harness.log).state
        for partition in (0, 1, 2):
            rows = payloads(spark, harness.table, partition)
            assert [json.loads(row)["id"] for row in rows] == [event["id"] for event in stream[partition]]
            assert state.get(partition).cursor == "44" and state.get(partition).position == 45
            assert harness.metadata(partition)["cursor"] == "44"
            assert harness.metadata(partition)["protocol"] == "jsonlines"

        stream[1].extend({"id": f"1-{n}", "n": n} for n in range(45, 60))  # the feed grows: the next run reads on
        (request,) = harness.tick_schedule().run_requests
        assert harness.launch(request).success
        assert len(payloads(spark, harness.table, 1)) == 60
        assert read_committed_state(harness.log).state.get(1).cursor == "59"
