"""`feedapi-dagster demo` (the main job on the embedded default) and `feedapi-dagster dev`.

Both work from any directory with nothing but the installed package: they start what the demo needs
- a bundled feed server (FeedAPI, or Nakadi with `--protocol nakadi`) and the embedded Spark
Connect server, each on 127.0.0.1 - keep the
lakehouse and DAGSTER_HOME in the current directory, and stop what they started. `dev` serves the
`dg` project or workspace of the current directory when it has one (this repository's
`dagster_project`), otherwise the demo code location of this module (`defs`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dagster as dg

import feedapi_dagster.demo
from feedapi_dagster.demo.demo_feeds import demo_feed_settings, demo_server
from feedapi_dagster.lakehouse.cursor_record import read_committed_state
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.lakehouse.maintenance import MaintenanceSettings
from feedapi_dagster.protocol import registered_protocols
from feedapi_dagster.spark.embedded import ensure_embedded_server
from feedapi_dagster.spark.jars import ensure_delta_jars
from feedapi_dagster.spark.server_record import stop_process_group
from feedapi_dagster.spark.settings import SparkSettings, installation_port

from .automation import load_request, register_discovered_partitions
from .config import FeedConfig, ProjectConfig, ScheduleConfig
from .definitions import build_feedapi_definitions, feed_bindings
from .loads import RESOURCE_KEY, FeedBinding
from .warm_up import WARM_UP_EVENTS, WarmUpFailed, warm_up

# package data: Dagster's default launcher and coordinator, and the `concurrency` a deployment needs
INSTANCE_TEMPLATE = Path(feedapi_dagster.demo.__file__).with_name("dagster.yaml")
DEMO_FEED_PORT = 8765
# how `feedapi-dagster dev` tells the demo code location (a process `dagster dev` starts) its ports
FEED_PORT_ENV, SPARK_PORT_ENV = "FEEDAPI_DAGSTER_DEMO_FEED_PORT", "FEEDAPI_DAGSTER_DEMO_SPARK_PORT"
PROTOCOL_ENV = "FEEDAPI_DAGSTER_DEMO_PROTOCOL"
# Dagster's setting for where runs are created: one ASSET_MATERIALIZATION_PLANNED event for a run over
# many partition keys instead of one per key (per key, a sync of thousands of partitions first spends
# seconds to minutes writing them to SQLite: figures in benchmarks/README.md, issue #18 part 2).
# What it costs: a failed run does not mark its partitions failed (docs/operations/scaling.md).
PLANNED_SUBSET_ENV = "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS"


def demo_project(
    root: Path, feed_port: int = DEMO_FEED_PORT, spark_port: int | None = None, protocol: str = "feedapi"
) -> ProjectConfig:
    """The demo: one feed `demo` on the bundled server of `protocol`, the embedded Spark (on
    `spark_port`, by default this installation's own), the lakehouse in `root` (the same settings as
    this repository's `dagster_project/defs/demo_feed/defs.yaml`)."""
    # flat, as a defs.yaml writes it: the protocol's settings beside the project's keys (`FeedConfig._flat`)
    feed = FeedConfig.model_validate(
        {
            "name": "demo",
            **demo_feed_settings(protocol, feed_port),
            "page_size_hint": 1000,
            "schedule": ScheduleConfig(
                cron="* * * * *", enabled=True, discovery_enabled=True, discovery_interval_seconds=30
            ),
            "maintenance": MaintenanceSettings(cron="0 3 * * *", time_travel_hours=168),
        }
    )
    return ProjectConfig(
        lakehouse=str(root / "lakehouse"),
        spark=SparkSettings(mode="embedded", port=spark_port or installation_port()),
        feeds=[feed],
    )


@dg.definitions
def defs() -> dg.Definitions:
    """The demo code location `feedapi-dagster dev` serves where the directory has no project."""
    return build_feedapi_definitions(
        demo_project(
            Path.cwd(),
            int(os.environ.get(FEED_PORT_ENV, DEMO_FEED_PORT)),
            int(os.environ.get(SPARK_PORT_ENV, installation_port())),
            os.environ.get(PROTOCOL_ENV, "feedapi"),
        )
    )


def register(subparsers: Any) -> None:
    demo = subparsers.add_parser("demo", help="load the demo feed through Dagster into ./lakehouse and print it")
    demo.add_argument("--events", type=int, default=20000, help="events the demo feed starts with")
    demo.add_argument("--partitions", type=int, default=4)
    demo.set_defaults(func=run_demo)
    dev = subparsers.add_parser("dev", help="`dagster dev` on the demo, with the demo feed and Spark running")
    dev.add_argument("--events", type=int, default=20000)
    dev.add_argument("--partitions", type=int, default=4)
    for command in (demo, dev):
        command.add_argument(
            "--feed-port", type=int, default=None, help=f"port of the demo FeedAPI server (default {DEMO_FEED_PORT})"
        )
        command.add_argument(
            "--spark-port",
            type=int,
            default=None,
            help=f"port of the embedded Spark server (default {installation_port()}, this installation's)",
        )
        command.add_argument(
            "--protocol",
            choices=sorted(registered_protocols()),
            default="feedapi",
            help="the demo feed's protocol: a FeedAPI feed or a Nakadi event type",
        )
    dev.add_argument("dagster_args", nargs=argparse.REMAINDER, help="passed on to `dagster dev`")
    dev.set_defaults(func=run_dev)


def _ports(args: argparse.Namespace) -> tuple[int, int]:
    """The demo feed's and the Spark server's ports the command was given, or the defaults."""
    return args.feed_port or DEMO_FEED_PORT, args.spark_port or installation_port()


def dagster_home(root: Path) -> Path:
    """DAGSTER_HOME, by default `.dagster_home` in `root`, with the demo's dagster.yaml."""
    home = Path(os.environ.get("DAGSTER_HOME") or root / ".dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        shutil.copy(INSTANCE_TEMPLATE, home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


@contextlib.contextmanager
def demo_services(project: ProjectConfig, events: int, partitions: int) -> Iterator[FeedConfig]:
    """The demo feed server on the first feed's URL, and the embedded Spark server (its jars resolved
    first when the cache is empty: installing the wheel is the whole set-up)."""
    feed = project.feeds[0]
    ensure_delta_jars(echo=lambda line: print(line, flush=True))
    with demo_server(feed.protocol, urlsplit(feed.url).port or DEMO_FEED_PORT, events, partitions) as server:
        print(f"demo {feed.protocol} server: {server.url}", flush=True)
        # the lakehouse's storage settings come with each run's session, not with the server; the
        # demo's server stops with the demo (the runs of `dev` use it, they do not start one)
        spark = ensure_embedded_server(project.spark.port, conf=project.spark.conf)
        print(f"Spark Connect server: {spark.url}", flush=True)
        try:
            yield feed
        finally:
            if spark.owned:
                spark.stop()


def run_demo(args: argparse.Namespace) -> int:
    root = Path.cwd()
    home = dagster_home(root)
    project = demo_project(root, *_ports(args), args.protocol)
    binding = next(feed_bindings(project))[0]
    os.environ.setdefault(PLANNED_SUBSET_ENV, "true")
    with demo_services(project, args.events, args.partitions), dg.DagsterInstance.get() as instance:
        definitions = build_feedapi_definitions(project)
        keys = register_discovered_partitions(instance, binding)
        # what the schedule asks for: one run of the asset over every open partition
        request = load_request(binding, [int(key) for key in keys], "demo", keys)
        job = definitions.resolve_job_def(binding.job_name)
        run = job.execute_in_process(
            run_config=request.run_config, instance=instance, tags=request.tags, raise_on_error=False
        )
        if not run.success:
            print("the load run failed; see the log above", file=sys.stderr)
            return 1
        assert definitions.resources is not None  # `build_feedapi_definitions` binds its FeedApiResource
        session = definitions.resources[RESOURCE_KEY].spark_session
        _print_table(session, binding.table_for(session), instance, binding, home)
    return 0


def _print_table(spark, table: FeedTable, instance: dg.DagsterInstance, binding: FeedBinding, home: Path) -> None:
    table.ensure_table()
    state = read_committed_state(table).state
    counts = {
        r.partition_id: r["count"]
        for r in spark.sql(
            f"SELECT partition_id, count(*) AS count FROM delta.`{table.path}` GROUP BY partition_id"
        ).collect()
    }
    print(f"\nDelta table {table.path}")
    print(f"{'partition':>9}  {'rows':>8}  {'position':>8}  {'drained':>7}  cursor")
    for partition_id, partition in sorted(state.partitions.items()):
        print(
            f"{partition_id:>9}  {counts.get(partition_id, 0):>8}  {partition.position:>8}  "
            f"{str(partition.drained):>7}  {partition.cursor}"
        )
    print(f"{'total':>9}  {sum(counts.values()):>8}")
    print(
        f"\nDagster partitions of {binding.key.to_user_string()}: "
        f"{', '.join(instance.get_dynamic_partitions(binding.partitions_name))}; runs and materializations "
        f"are in DAGSTER_HOME={home} (see them with `feedapi-dagster dev`)."
    )


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_dev(args: argparse.Namespace) -> int:
    root = Path.cwd()
    dagster_home(root)
    # stopped by a supervisor (SIGTERM) as by Ctrl-C: `dagster dev`, the feed server and Spark stop too
    signal.signal(signal.SIGTERM, _interrupt)
    extra = [a for a in args.dagster_args if a != "--"]
    feed_port, spark_port = _ports(args)
    env = {PLANNED_SUBSET_ENV: "true", **os.environ}
    if (root / "workspace.yaml").exists():
        if args.feed_port or args.spark_port or args.protocol != "feedapi":
            print(
                "--feed-port, --spark-port and --protocol serve the demo; this directory's workspace.yaml sets "
                "its own feeds (in their defs.yaml)",
                file=sys.stderr,
            )
            return 2
        target = ["-w", str(root / "workspace.yaml")]
    else:
        target = ["-m", __name__]
        env.update({FEED_PORT_ENV: str(feed_port), SPARK_PORT_ENV: str(spark_port), PROTOCOL_ENV: args.protocol})
    with demo_services(demo_project(root, feed_port, spark_port, args.protocol), args.events, args.partitions):
        # while `dagster dev` starts (20-40 s), so that the sensor's first run finds a warm server
        threading.Thread(target=_warm_up, args=(spark_port,), name="spark-warm-up", daemon=True).start()
        command = [str(Path(sys.executable).with_name("dagster")), "dev", *target, *extra]
        print("running:", " ".join(command), flush=True)
        # its own process group: stopped as a whole (webserver, daemon, code servers), as `timeout` would
        process = subprocess.Popen(command, cwd=root, env=env, start_new_session=True)
        try:
            return process.wait()
        except KeyboardInterrupt:
            return _stop_dagster_dev(process)


def _warm_up(port: int) -> None:
    print(f"warming the Spark server up ({WARM_UP_EVENTS:,} events of a scratch feed into a scratch table)", flush=True)
    try:
        record = warm_up(port)
    except WarmUpFailed as failed:
        print(str(failed), file=sys.stderr, flush=True)
        return
    if record is not None:
        print(record.describe(), flush=True)


def _stop_dagster_dev(process: subprocess.Popen, grace_seconds: float = 20) -> int:
    """Its exit code once its process group is gone (SIGKILLed after `grace_seconds`)."""
    if not stop_process_group(process.pid, grace_seconds):
        print(f"`dagster dev`'s processes (group {process.pid}) survived SIGKILL", file=sys.stderr)
        return 1
    return process.wait()
