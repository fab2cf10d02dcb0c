"""`feedapi-dagster discover`: the feeds' partitions added to the Dagster instance now, as the first
tick of each feed's discovery sensor adds them, so that a partition can be launched from the command
line (`dg launch --assets feedapi/orders --partition 0`) without the daemon.

Run in a `dg` project's folder: its definitions are loaded as `dg` loads them (the project's `.env`
too), and each `feedapi_<feed>_discovery` sensor is evaluated once against the instance of DAGSTER_HOME;
its partitions are added, its run requests are not launched (the sensor, once on, requests them).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import dagster as dg

from feedapi_dagster.errors import FeedApiDagsterError, ProjectDoesNotLoad

from .doctor import dagster_home_setting
from .project_definitions import load_project_definitions

SENSOR_PREFIX, SENSOR_SUFFIX = "feedapi_", "_discovery"


def register(subparsers: Any) -> None:
    command = subparsers.add_parser(
        "discover",
        help="add the feeds' partitions to the Dagster instance now, as the discovery sensors do (run in a dg project)",
        description=__doc__.splitlines()[0],
    )
    command.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        defs = load_project_definitions(Path.cwd())
    except ProjectDoesNotLoad as error:
        print(error)
        return 1
    home = dagster_home_setting()
    if home is None:
        print("DAGSTER_HOME is not set: set it (in the environment, or the project's .env) and run this again")
        return 1
    sensors = [
        sensor
        for sensor in defs.get_repository_def().sensor_defs
        if sensor.name.startswith(SENSOR_PREFIX) and sensor.name.endswith(SENSOR_SUFFIX)
    ]
    if not sensors:
        print(f"no feed in the dg project at {Path.cwd()} (no sensor {SENSOR_PREFIX}<feed>{SENSOR_SUFFIX})")
        return 1
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for sensor in sensors:
            feed = sensor.name.removeprefix(SENSOR_PREFIX).removesuffix(SENSOR_SUFFIX)
            try:
                result = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
            except (dg.Failure, FeedApiDagsterError) as error:
                said = str(getattr(error, "description", None) or error)
                print(said if said.startswith(f"feed {feed}:") else f"feed {feed}: {said}")
                return 1
            assert isinstance(result, dg.SensorResult)  # what a discovery sensor returns
            for request in result.dynamic_partitions_requests or []:
                assert isinstance(request, dg.AddDynamicPartitionsRequest)
                instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
            keys = instance.get_dynamic_partitions(f"{SENSOR_PREFIX}{feed}")
            print(f"feed {feed}: partitions {', '.join(keys) or 'none'}")
    return 0
