"""Discovery, loads (runs of the feed's asset), a method-2 split and a backfill through Dagster, on
a Spark cluster reached over Spark Connect (`spark.mode: remote`). Runs in its own process: a Connect
client cannot share a process with the tests' classic Spark session.

    python cluster_flow.py FEED_URL LAKEHOUSE SPARK_CONNECT_URL DAGSTER_HOME [STORAGE_JSON]

STORAGE_JSON: the `S3Storage` of an s3a:// LAKEHOUSE; its s3a settings reach the cluster as settings
of the run's Spark session (`ProjectConfig.spark_settings`), its credentials are the cluster's own.

The feed server is driven through its admin API; prints one JSON line of what happened.
"""

import json
import sys

import dagster as dg
import requests

from feedapi_dagster.orchestration import FeedConfig, ProjectConfig, build_feedapi_definitions
from feedapi_dagster.orchestration.config import StorageConfig
from feedapi_dagster.protocol import RetryPolicy
from feedapi_dagster.spark.settings import SparkSettings
from feedapi_dagster.spark.storage import S3Storage
from tests.orchestration.conftest import Harness


def main() -> None:
    url, lakehouse, remote, home = sys.argv[1:5]
    s3 = S3Storage.model_validate_json(sys.argv[5]) if len(sys.argv) > 5 else None
    admin = url.rsplit("/feed", 1)[0] + "/admin"
    feed = FeedConfig(
        name="orders",
        url=url,
        page_size_hint=50,
        token_env="CLUSTER_FEED_TOKEN",
        retry=RetryPolicy(base_delay=0.01, max_delay=0.1),
    )
    spark = SparkSettings(mode="remote", remote=remote)
    project = ProjectConfig(lakehouse=lakehouse, storage=StorageConfig(s3=s3), spark=spark, feeds=[feed])
    defs = build_feedapi_definitions(project)
    outcome: dict = {"runs": []}
    with dg.instance_for_test(temp_dir=home) as instance:
        harness = Harness(None, None, project, defs, instance)

        def run_requested(step: str) -> None:
            for request in harness.tick_sensor().run_requests:
                result = harness.launch(request)
                outcome["runs"].append([step, result.success])

        run_requested("discovery")
        children = requests.post(f"{admin}/split", json={"method": 2, "partition": 0}).json()["children"]
        requests.post(f"{admin}/append", json={"count": 120})
        run_requested("split")
        for request in harness.tick_schedule().run_requests:  # the open partitions' new events
            outcome["runs"].append(["schedule", harness.launch(request).success])
        requests.post(f"{admin}/close", json={"partition": 1})
        result = harness.materialize_partition(1, tags={"dagster/backfill": "cluster-bf"})
        outcome["runs"].append(["backfill", result.success])
        (event,) = result.get_asset_materialization_events()
        outcome["backfill"] = {
            k: v.value for k, v in event.materialization.metadata.items() if k in ("rebuilt", "drained", "events")
        }
        outcome["children"] = children
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()
