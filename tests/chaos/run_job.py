"""A Dagster run in its own process, as the run launcher would start it (the chaos suite kills it).

    python run_job.py '{"kind": "load", "run_config": {...}, "tags": {...}}'
    python run_job.py '{"kind": "asset", "partition": "3", "tags": {...}}'
    python run_job.py '{"kind": "maintenance"}'

`load`: a run of the feed's load job with the run config and tags of a `load_request(...)`;
`asset`: a materialization of one partition of the feed's asset (a backfill, the UI);
`maintenance`: a run of the feed's maintenance job (OPTIMIZE, VACUUM).
Uses DAGSTER_HOME and CHAOS_PROJECT_JSON (a file holding the harness's `ProjectConfig` as JSON) from
the environment.
"""

import json
import os
import sys
from pathlib import Path

import dagster as dg

from feedapi_dagster.orchestration import (
    RESOURCE_KEY,
    FeedApiTranslator,
    FeedTranslatorData,
    ProjectConfig,
    build_feedapi_definitions,
)

PROJECT_ENV = "CHAOS_PROJECT_JSON"  # tests.chaos.harness.PROJECT_ENV (not imported: this runs as a script)


def main() -> int:
    spec = json.loads(sys.argv[1])
    project = ProjectConfig.model_validate_json(Path(os.environ[PROJECT_ENV]).read_text())
    feed = project.feeds[0]
    defs = build_feedapi_definitions(project)
    with dg.DagsterInstance.get() as instance:
        if spec["kind"] == "load":
            result = defs.resolve_job_def(f"feedapi_{feed.name}_load").execute_in_process(
                run_config=spec.get("run_config") or {},
                instance=instance,
                tags=spec.get("tags") or {},
                raise_on_error=False,
            )
        elif spec["kind"] == "asset":
            key = FeedApiTranslator().get_asset_spec(FeedTranslatorData(feed, project.table_path(feed))).key
            asset = defs.get_assets_def(key)
            result = dg.materialize(
                [asset],
                partition_key=spec["partition"],
                instance=instance,
                resources={RESOURCE_KEY: defs.resources[RESOURCE_KEY]},
                tags=spec.get("tags") or {},
                raise_on_error=False,
            )
        elif spec["kind"] == "maintenance":
            result = defs.resolve_job_def(f"feedapi_{feed.name}_maintenance").execute_in_process(
                instance=instance, raise_on_error=False
            )
        else:
            raise ValueError(f"unknown run kind {spec['kind']!r}")
    return 0 if result.success else 3


if __name__ == "__main__":  # reader processes are spawned: they import this module
    sys.exit(main())
