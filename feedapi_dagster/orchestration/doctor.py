"""`feedapi-dagster doctor`: whether a Dagster instance has the settings feed loads need.

A Dagster instance is configured by the `dagster.yaml` in its DAGSTER_HOME (`dg dev` and `dagster
dev` read DAGSTER_HOME from the project folder's `.env` too; without one they run a temporary
instance configured by the `dagster.yaml` of that folder). Loads rely on three of its settings, none of them Dagster's default: a pool limit (every
feed's load step is in pool `feedapi_<feed>`: one load of a feed at a time), one run per partition
(a tag concurrency limit on `feedapi/partition`, "<feed>/<partition>"), and run monitoring that frees a killed run's pool
slot. `feedapi-dagster doctor` reads the instance as Dagster does and names what is missing and what
happens without it; `--write-config` writes the `dagster.yaml` the package ships where there is none.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from .demo_commands import INSTANCE_TEMPLATE
from .loads import PARTITION_LIMIT_TAG

# the key of the limit up to 0.x's dagster.yaml: one run per partition key, whatever its feed
DAGSTER_PARTITION_TAG = "dagster/partition"
# SQLAlchemy 2.1 maps a bare `postgresql://` to psycopg 3, while dagster-postgres brings psycopg2: an
# instance whose storage says `postgresql://` (Dagster's documented form) cannot be opened
PSYCOPG3 = "psycopg"
PLAIN_POSTGRES_SCHEME = (
    "dagster.yaml: storage.postgres names the driver-less scheme postgresql://, which SQLAlchemy 2.1 reads as "
    "psycopg 3 (not installed; dagster-postgres brings psycopg2): write postgres_url: postgresql+psycopg2://... "
    "or, under postgres_db, scheme: postgresql+psycopg2"
)


@dataclass(frozen=True)
class Finding:
    ok: bool
    setting: str  # what it is, as the dagster.yaml says it
    said: str  # its value, or what goes wrong without it


def instance_findings(instance: dg.DagsterInstance) -> list[Finding]:
    """What the instance has and lacks of the settings loads need."""
    config = instance.get_concurrency_config()
    queued = type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
    default_limit = config.pool_config.default_pool_limit
    # another run coordinator than the queued one has no run queue, so no tag limit
    tag_limits = config.run_queue_config.tag_concurrency_limits if config.run_queue_config is not None else []
    limited_keys = {
        limit.get("key")
        for limit in tag_limits
        if limit.get("limit") == 1
        and isinstance(limit.get("value"), dict)
        and limit["value"].get("applyLimitPerUniqueValue")
    }
    one_run_per_partition = bool(limited_keys & {PARTITION_LIMIT_TAG, DAGSTER_PARTITION_TAG})
    frees_slots = (
        instance.run_monitoring_enabled
        and instance.run_monitoring_settings.get("free_slots_after_run_end_seconds") is not None
    )
    return [
        Finding(
            queued,
            "run_coordinator: QueuedRunCoordinator",
            "queued (the concurrency limits below apply)"
            if queued
            else f"{type(instance.run_coordinator).__name__}: runs start at once, no concurrency limit applies",
        ),
        Finding(
            default_limit is not None,
            "concurrency.pools.default_limit",
            f"{default_limit} (pool feedapi_<feed>: {default_limit} load(s) of a feed at a time)"
            if default_limit is not None
            else "not set: the pools feedapi_<feed> have no limit, so the loads of one feed (the schedule's, "
            "the sensor's, a backfill's) run at once, each its own Spark job, their Delta commits "
            "conflicting and retried, instead of waiting for each other in the queue",
        ),
        Finding(
            one_run_per_partition,
            f"concurrency.runs.tag_concurrency_limits: {PARTITION_LIMIT_TAG} (applyLimitPerUniqueValue, limit 1)",
            "one run per partition of a feed at a time"
            if PARTITION_LIMIT_TAG in limited_keys
            else f"{DAGSTER_PARTITION_TAG} is limited instead: one run per partition key whatever its feed, so "
            f"partition 0 of two feeds wait for each other; the key {PARTITION_LIMIT_TAG} limits runs per feed"
            if one_run_per_partition
            else "not set: two runs of one partition (a backfill and a materialization from the UI) both "
            'start, and the second fails ("another run is loading it") or skips it instead of waiting '
            "in the queue",
        ),
        Finding(
            bool(frees_slots),
            "run_monitoring: enabled, free_slots_after_run_end_seconds",
            f"a killed run's pool slot is freed after "
            f"{instance.run_monitoring_settings.get('free_slots_after_run_end_seconds')} s (a load whose "
            "process died unseen is first failed by sensor feedapi_<feed>_stalled_loads)"
            if frees_slots
            else "not set: a load that is killed (its process, its machine) keeps its feed's pool slot, and "
            "every later load of the feed waits in the queue for good",
        ),
    ]


@contextmanager
def open_instance(dagster_home: Path | None) -> Iterator[tuple[dg.DagsterInstance, str]]:
    """The instance `dg dev` would run on, and where its settings come from."""
    if dagster_home is not None:
        configured = (dagster_home / "dagster.yaml").exists()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Dagster's own warning of a missing dagster.yaml: said below
            instance = dg.DagsterInstance.from_config(str(dagster_home))
        with instance:
            yield (
                instance,
                (f"DAGSTER_HOME {dagster_home}" + ("" if configured else " (no dagster.yaml: Dagster's defaults)")),
            )
        return
    # what `dagster dev` does without DAGSTER_HOME: a temporary instance, configured from the folder
    # (no public API builds it; InstanceRef.from_dir is what `dagster dev` itself calls)
    from dagster._core.instance.ref import InstanceRef

    with (
        tempfile.TemporaryDirectory() as storage,
        dg.DagsterInstance.from_ref(InstanceRef.from_dir(storage, config_dir=os.getcwd())) as instance,
    ):
        config = Path.cwd() / "dagster.yaml"
        yield (
            instance,
            (
                f"DAGSTER_HOME is not set: `dg dev` run here would use a temporary instance (its runs are "
                f"forgotten when it exits), configured by {config}"
                + ("" if config.exists() else " (there is none: Dagster's defaults)")
            ),
        )


def register(subparsers: argparse._SubParsersAction) -> None:
    command = subparsers.add_parser(
        "doctor",
        help="check that the Dagster instance (DAGSTER_HOME) has the pool and concurrency settings loads need",
        description=__doc__.splitlines()[0],
    )
    command.add_argument(
        "--dagster-home",
        type=Path,
        default=None,
        help="the instance's folder (default: DAGSTER_HOME, from this folder's .env as dg dev "
        "reads it, or the environment)",
    )
    command.add_argument(
        "--write-config",
        action="store_true",
        help="write the dagster.yaml feedapi-dagster ships into DAGSTER_HOME when it has none",
    )
    command.set_defaults(func=run)


def dagster_home_setting() -> Path | None:
    """DAGSTER_HOME as `dg dev` run in this folder sees it: the folder's `.env` first, then the environment."""
    # the `.env` reader `dg dev` uses (Dagster has no public one)
    from dagster._core.secrets.env_file import get_env_var_dict

    value = get_env_var_dict(os.getcwd()).get("DAGSTER_HOME") or os.environ.get("DAGSTER_HOME")
    return Path(value) if value else None


def run(args: argparse.Namespace) -> int:
    home = args.dagster_home or dagster_home_setting()
    if args.write_config:
        if home is None:
            print(
                "DAGSTER_HOME is not set: set it to the instance's folder, e.g. in the project's .env "
                "(`echo DAGSTER_HOME=$PWD/.dagster >> .env`, which dg dev reads), and run this again"
            )
            return 1
        written = write_config(home)
        print(f"wrote {written}" if written else f"{home / 'dagster.yaml'} exists: left as it is")
    if home is not None and not home.is_dir():
        print(
            f"DAGSTER_HOME {home} is no folder: create it, or run `feedapi-dagster doctor --write-config` "
            "(it creates it, with the dagster.yaml feedapi-dagster ships)"
        )
        return 1
    try:
        with open_instance(home) as (instance, source):
            findings = instance_findings(instance)
    except ModuleNotFoundError as error:
        if error.name != PSYCOPG3:
            raise
        print(PLAIN_POSTGRES_SCHEME)
        return 1
    return report(source, findings, home)


def report(source: str, findings: list[Finding], home: Path | None) -> int:
    print(source)
    for finding in findings:
        print(f"  {'ok' if finding.ok else 'MISSING':8} {finding.setting}: {finding.said}")
    missing = [f for f in findings if not f.ok]
    if not missing:
        print("the instance has what feed loads need")
        return 0
    how = (
        " (`feedapi-dagster doctor --write-config` writes it where DAGSTER_HOME has none)"
        if home
        else " (as dagster.yaml in this folder, or in DAGSTER_HOME: `feedapi-dagster doctor --write-config`)"
    )
    print(f"{len(missing)} setting(s) missing. Add them from the dagster.yaml feedapi-dagster ships{how}:\n")
    print(INSTANCE_TEMPLATE.read_text())
    return 1


def write_config(home: Path) -> Path | None:
    """The shipped dagster.yaml, written into `home` (created) unless it has one."""
    target = home / "dagster.yaml"
    if target.exists():
        return None
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(INSTANCE_TEMPLATE, target)
    return target
