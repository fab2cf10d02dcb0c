"""A Dagster run in its own process, as the run launcher would start it (the chaos suite kills it).

    python run_job.py '{"kind": "sync", "run_config": {...}, "tags": {...}}'
    python run_job.py '{"kind": "asset", "partition": "3", "tags": {...}}'
Uses DAGSTER_HOME and FEEDAPI_DAGSTER_CONFIG from the environment.
"""
import json
import sys

import dagster as dg

from feedapi_dagster.orchestration import build_definitions, load_config


def main() -> int:
    spec = json.loads(sys.argv[1])
    config = load_config()
    feed = config.feeds[0]
    defs = build_definitions(config)
    with dg.DagsterInstance.get() as instance:
        if spec["kind"] == "sync":
            result = defs.get_job_def(f"feedapi_{feed.name}_sync").execute_in_process(
                run_config=spec.get("run_config") or {}, instance=instance, tags=spec.get("tags") or {},
                raise_on_error=False)
        else:
            asset = defs.get_assets_def(dg.AssetKey(["feedapi", feed.name]))
            result = dg.materialize([asset], partition_key=spec["partition"], instance=instance,
                                    resources={"spark": defs.resources["spark"]}, tags=spec.get("tags") or {},
                                    raise_on_error=False)
    return 0 if result.success else 3


if __name__ == "__main__":  # reader processes are spawned: they import this module
    sys.exit(main())
