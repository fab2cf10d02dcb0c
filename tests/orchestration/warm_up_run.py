"""What `dg dev`'s processes do, in a process of its own (a pytest worker may hold a classic Spark
session, beside which pyspark makes no Connect session): the definitions loaded with
`dagster dev`'s markers set (the embedded server on SPARK_PORT started and warmed in the background),
loaded again, then a run of partition 0 (`test_warm_up.py`). Prints what it saw as JSON.

Usage: warm_up_run.py FEED_URL SPARK_PORT LAKEHOUSE"""

import json
import os
import sys
import time

import dagster as dg

from feedapi_dagster.orchestration import FeedConfig, ProjectConfig, build_feedapi_definitions
from feedapi_dagster.orchestration.warm_up import read_warm_up
from feedapi_dagster.spark.connect_server import port_open
from feedapi_dagster.spark.settings import SparkSettings
from tests.conftest import TEST_SERVER_CONF


def main(feed_url: str, spark_port: str, lakehouse: str) -> None:
    # what `dg dev` and `dagster dev` set for their code servers
    os.environ.update({"DAGSTER_IS_DEV_CLI": "1", "DAGSTER_verbose": ""})
    port = int(spark_port)
    project = ProjectConfig(
        lakehouse=lakehouse,
        spark=SparkSettings(mode="embedded", port=port, conf=TEST_SERVER_CONF),
        feeds=[FeedConfig(name="orders", url=feed_url, payload_form="variant")],
    )
    began = time.monotonic()
    defs = build_feedapi_definitions(project)
    seen = {"load_seconds": time.monotonic() - began, "port_open_after_load": port_open(port)}
    deadline = time.monotonic() + 120
    while (record := read_warm_up(port)) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    seen["first_record"] = record and {"state": record.state, "forms": list(record.forms)}
    build_feedapi_definitions(project)  # a run's process, a code server's reload: nothing more starts
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("feedapi_orders", ["0", "1"])
        result = dg.materialize(
            [defs.get_assets_def(dg.AssetKey(["feedapi", "orders"]))],
            partition_key="0",
            instance=instance,
            resources=defs.resources,
        )
        seen["said"] = [entry.user_message for entry in instance.all_logs(result.run_id)]
    seen["success"] = result.success
    (materialized,) = result.asset_materializations_for_node("feedapi__orders")
    seen["position"] = materialized.metadata["position"].value
    print(json.dumps(seen))


if __name__ == "__main__":
    main(*sys.argv[1:])
