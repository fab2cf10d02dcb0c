"""`feedapi-dagster demo` (the main job on the embedded default) and `feedapi-dagster dev`.

Both start what the demo needs - the bundled FeedAPI server and the embedded Spark Connect server,
each on 127.0.0.1 - and stop what they started.
"""
import argparse
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dagster as dg

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.lakehouse.delta import FeedTable
from feedapi_dagster.lakehouse.spark import ensure_embedded_server
from feedapi_dagster.lakehouse.state import read_committed_state

from .automation import register_discovered_partitions
from .config import FeedConfig, ProjectConfig, load_config
from .definitions import build_definitions
from .loads import feed_table, partitions_def_name

ROOT = Path(__file__).resolve().parents[2]
INSTANCE_TEMPLATE = ROOT / "dagster_project" / "dagster.yaml"


def register(subparsers: Any) -> None:
    demo = subparsers.add_parser("demo", help="load the demo feed through Dagster into the lakehouse and print it")
    demo.add_argument("--events", type=int, default=20000, help="events the demo feed starts with")
    demo.add_argument("--partitions", type=int, default=4)
    demo.set_defaults(func=run_demo)
    dev = subparsers.add_parser("dev", help="`dagster dev` on the demo, with the demo feed and Spark running")
    dev.add_argument("--events", type=int, default=20000)
    dev.add_argument("--partitions", type=int, default=4)
    dev.add_argument("dagster_args", nargs=argparse.REMAINDER, help="passed on to `dagster dev`")
    dev.set_defaults(func=run_dev)


def dagster_home() -> Path:
    """DAGSTER_HOME, defaulting to .dagster_home in the repository, with the project's dagster.yaml."""
    home = Path(os.environ.get("DAGSTER_HOME") or ROOT / ".dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        shutil.copy(INSTANCE_TEMPLATE, home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


@contextlib.contextmanager
def demo_services(project: ProjectConfig, events: int, partitions: int) -> Iterator[FeedConfig]:
    """The demo feed server on the first feed's URL, and the embedded Spark server if configured."""
    feed = project.feeds[0]
    address = urlsplit(feed.url)
    with DemoFeedServer(DemoFeed(partitions=partitions, events=events), dialect="published",
                        host=address.hostname or "127.0.0.1", port=address.port or 80) as server:
        print(f"demo FeedAPI server: {server.url}", flush=True)
        spark = None
        if project.spark.mode == "embedded":
            spark = ensure_embedded_server(project.spark.port, conf=project.spark.conf, detach=True)
            print(f"Spark Connect server: {spark.url}", flush=True)
        try:
            yield feed
        finally:
            if spark is not None and spark.owned:
                spark.stop()


def run_demo(args: argparse.Namespace) -> int:
    home = dagster_home()
    project = load_config()
    with demo_services(project, args.events, args.partitions) as feed, dg.DagsterInstance.get() as instance:
        defs = build_definitions(project)
        register_discovered_partitions(instance, feed)
        job = defs.get_job_def(f"feedapi_{feed.name}_sync")
        run = job.execute_in_process(instance=instance, tags={"feedapi/feed": feed.name})
        if not run.success:
            print("the sync run failed; see the log above", file=sys.stderr)
            return 1
        spark = defs.resources["spark"]
        _print_table(spark.session(), feed_table(project, feed, spark), instance, partitions_def_name(feed), home)
    return 0


def _print_table(spark, table: FeedTable, instance: dg.DagsterInstance, partitions_name: str, home: Path) -> None:
    path = table.path
    state = read_committed_state(table).state
    counts = {r.partition_id: r["count"] for r in spark.sql(
        f"SELECT partition_id, count(*) AS count FROM delta.`{path}` GROUP BY partition_id").collect()}
    print(f"\nDelta table {path}")
    print(f"{'partition':>9}  {'rows':>8}  {'position':>8}  {'drained':>7}  cursor")
    for partition_id, partition in sorted(state.partitions.items()):
        print(f"{partition_id:>9}  {counts.get(partition_id, 0):>8}  {partition.position:>8}  "
              f"{str(partition.drained):>7}  {partition.cursor}")
    print(f"{'total':>9}  {sum(counts.values()):>8}")
    print(f"\nDagster partitions: {', '.join(instance.get_dynamic_partitions(partitions_name))}; "
          f"runs and materializations are in DAGSTER_HOME={home} (see them with `make dev`).")


def run_dev(args: argparse.Namespace) -> int:
    dagster_home()
    project = load_config()
    extra = [a for a in args.dagster_args if a != "--"]
    with demo_services(project, args.events, args.partitions):
        dagster = Path(sys.executable).with_name("dagster")
        command = [str(dagster), "dev", "-w", str(ROOT / "workspace.yaml"), *extra]
        print("running:", " ".join(command), flush=True)
        process = subprocess.Popen(command, cwd=ROOT)
        try:
            return process.wait()
        except KeyboardInterrupt:
            process.terminate()
            return process.wait()
