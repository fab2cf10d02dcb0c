"""A snapshot of the whole Definitions built from the shipped feeds file: names are a contract.

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
        }
    return {
        "assets": assets,
        "jobs": sorted(j.name for j in repo.get_all_jobs() if not j.name.startswith("__")),
        "sensors": {s.name: {"default_status": s.default_status.value, "jobs": sorted(j.name for j in s.jobs)}
                    for s in repo.sensor_defs},
        "schedules": {s.name: {"cron": s.cron_schedule, "default_status": s.default_status.value}
                      for s in repo.schedule_defs},
        "resources": sorted(defs.resources),
    }


def test_definitions_match_the_snapshot(monkeypatch):
    monkeypatch.delenv("FEEDAPI_DAGSTER_CONFIG", raising=False)
    from dagster_project.definitions import defs

    dg.Definitions.validate_loadable(defs)
    current = describe(defs)
    if os.environ.get("UPDATE_SNAPSHOTS") or not SNAPSHOT.exists():
        SNAPSHOT.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    assert current == json.loads(SNAPSHOT.read_text())
