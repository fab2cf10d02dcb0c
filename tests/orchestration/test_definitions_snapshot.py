"""A snapshot of the whole Definitions of this repository's dg project (dagster_project/defs): names
are a contract.

Regenerate after an intended change with: UPDATE_SNAPSHOTS=1 make test
"""

import json
import os
from pathlib import Path

import dagster as dg

SNAPSHOT = Path(__file__).with_name("definitions_snapshot.json")


def describe(defs: dg.Definitions) -> dict:
    repo = defs.get_repository_def()
    assets = {}
    for asset in repo.asset_graph.asset_nodes:
        partitions = asset.partitions_def
        assets["/".join(asset.key.path)] = {
            "partitions": getattr(partitions, "name", None),
            "group": asset.group_name,
            "kinds": sorted(asset.kinds),
            "checks": sorted(k.name for k in asset.check_keys),
            "blocking_checks": sorted(s.name for s in defs.resolve_assets_def(asset.key).check_specs if s.blocking),
            "pool": defs.resolve_assets_def(asset.key).op.pool,
            "metadata": sorted(asset.metadata),
        }
    return {
        "assets": assets,
        "jobs": {
            j.name: {
                "executor": j.executor_def.name,
                "assets": sorted("/".join(k.path) for k in j.asset_layer.selected_asset_keys),
            }
            for j in repo.get_all_jobs()
            if not j.name.startswith("__")
        },
        "sensors": {
            s.name: {
                "default_status": s.default_status.value,
                "jobs": sorted(j.name for j in s.jobs) if s.has_jobs else [],  # the stalled-load sensor has none
            }
            for s in repo.sensor_defs
        },
        "schedules": {
            s.name: {"cron": s.cron_schedule, "default_status": s.default_status.value} for s in repo.schedule_defs
        },
        "resources": sorted(defs.resources),
    }


def test_definitions_match_the_snapshot():
    defs = dg.load_from_defs_folder(path_within_project=Path(__file__).resolve().parents[2])
    dg.Definitions.validate_loadable(defs)
    current = describe(defs)
    if os.environ.get("UPDATE_SNAPSHOTS"):
        SNAPSHOT.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    # a missing snapshot fails: deleting it must not make the test pass
    assert SNAPSHOT.exists(), f"{SNAPSHOT.name} is missing: UPDATE_SNAPSHOTS=1 writes it after an intended change"
    assert current == json.loads(SNAPSHOT.read_text())
