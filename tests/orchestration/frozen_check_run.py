"""A run of feed `orders` (partition 0) whose checks include one that freezes the Spark Connect server
(SIGSTOP) and then asks it something (`test_frozen_spark.py`). Prints what the run did as JSON.

Usage: frozen_check_run.py FEED_URL SPARK_PORT SPARK_PID LAKEHOUSE BOUND"""

import json
import os
import signal
import sys
import time

import dagster as dg

from feedapi_dagster.lakehouse import LoadSettings
from feedapi_dagster.orchestration import FeedConfig, ProjectConfig, build_feedapi_definitions
from feedapi_dagster.orchestration.checks import CheckedLoad, feed_check
from feedapi_dagster.spark.settings import SparkSettings


def main(feed_url: str, spark_port: str, spark_pid: str, lakehouse: str, bound: str) -> None:
    frozen_at: list[float] = []

    @feed_check("freezes_spark", "freezes the Spark server, then asks it something")
    def freezes_spark(load: CheckedLoad) -> dg.AssetCheckResult:
        os.killpg(int(spark_pid), signal.SIGSTOP)
        frozen_at.append(time.time())
        load.outcome.table.spark.sql("SELECT 1").collect()
        return dg.AssetCheckResult(passed=True)

    project = ProjectConfig(
        lakehouse=lakehouse,
        spark=SparkSettings(mode="embedded", port=int(spark_port)),
        feeds=[FeedConfig(name="orders", url=feed_url, load=LoadSettings(spark_unresponsive_seconds=float(bound)))],
    )
    defs = build_feedapi_definitions(project)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("feedapi_orders", ["0"])
        result = dg.materialize(
            [defs.get_assets_def(dg.AssetKey(["feedapi", "orders"]))],
            partition_key="0",
            instance=instance,
            resources=defs.resources,
            raise_on_error=False,
        )
    failures = [event for event in result.all_events if event.is_step_failure]
    (materialized,) = result.asset_materializations_for_node("feedapi__orders")
    print(
        json.dumps(
            {
                "success": result.success,
                "failure": failures[0].step_failure_data.error.cause.message if failures else None,
                "ended_after": time.time() - frozen_at[0] if frozen_at else None,
                "position": materialized.metadata["position"].value,
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
