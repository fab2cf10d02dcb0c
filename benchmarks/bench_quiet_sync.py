#!/usr/bin/env python
"""What a sync with nothing new costs a Dagster instance, at thousands of partitions.

    .venv/bin/python benchmarks/bench_quiet_sync.py                  # 2,000 partitions x 10 events
    .venv/bin/python benchmarks/bench_quiet_sync.py --partitions 500

One deployment as `bench_sync.py` makes it (the demo feed in its own process, the embedded Spark
Connect server, a code location, DAGSTER_HOME with the shipped dagster.yaml, SQLite), one scheduled
sync that loads every partition (untimed), then, timed from the run's creation to the exit of its
`dagster api execute_run` process:

1. the schedule's sync with nothing new: the events it writes to the instance (no materialization per
   partition, one observation of the asset saying when it was synced);
2. a run asked for every partition by name (a backfill's run, tagged `dagster/backfill`), with nothing
   new: one materialization per partition, since a backfill's partitions succeed only so.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_sync import BIN, PLANNED_SUBSET_ENV, Setup, prepare, run_sync, start_feed_server, start_spark
from procstat import stop_process


def run_asked(setup: Setup, tags: dict[str, str]) -> tuple[str, float]:
    """A run of the feed's job with `tags`, in a `dagster api execute_run` process; its id and seconds
    from its creation to the exit of that process."""
    from dagster._core.definitions.reconstruct import ReconstructableRepository
    from dagster._grpc.types import ExecuteRunArgs
    from dagster._serdes import serialize_value

    job_name = setup.binding.job_name
    started = time.perf_counter()
    origin = (
        ReconstructableRepository.for_file(
            str(setup.location / "definitions.py"), "defs", working_directory=str(setup.location)
        )
        .get_reconstructable_job(job_name)
        .get_python_origin()
    )
    run = setup.instance.create_run_for_job(setup.defs.resolve_job_def(job_name), tags=tags, job_code_origin=origin)
    args = ExecuteRunArgs(
        job_origin=run.job_code_origin,
        run_id=run.run_id,
        instance_ref=setup.instance.get_ref(),
        set_exit_code_on_failure=True,
    )
    with open(setup.base / "asked-run.log", "wb") as log:
        code = subprocess.call(
            [str(BIN / "dagster"), "api", "execute_run", serialize_value(args)],
            env=setup.env,
            cwd=setup.location,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    if code != 0 or not setup.instance.get_run_by_id(run.run_id).is_success:
        raise RuntimeError(f"the run failed (exit {code}): {setup.base / 'asked-run.log'}")
    return run.run_id, time.perf_counter() - started


def events_of(setup: Setup, run_id: str) -> collections.Counter:
    return collections.Counter(
        entry.dagster_event.event_type_value if entry.dagster_event else "log message"
        for entry in setup.instance.all_logs(run_id)
    )


def say_run(name: str, seconds: float, counts: collections.Counter) -> None:
    shown = ", ".join(f"{kind} {count}" for kind, count in counts.most_common())
    print(f"{name}: {seconds:.1f} s, {sum(counts.values())} events in the instance ({shown})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=2000)
    parser.add_argument("--events", type=int, default=20_000, help="in all (spread over the partitions)")
    args = parser.parse_args()
    os.environ.setdefault(PLANNED_SUBSET_ENV, "true")  # what README "Thousands of partitions" says to set
    from procstat import find_free_port

    work = Path(tempfile.mkdtemp(prefix="bench-quiet-"))
    feed = spark = None
    try:
        feed, url = start_feed_server("feedapi", args.partitions, args.events, work / "feed-server.log")
        spark = start_spark(find_free_port(), work / "spark", None)
        setup = prepare(work / "deployment", "feedapi", url, 100, spark.port, None)
        first = run_sync(setup, "first sync", args.events, spark.pid)
        print(f"first sync (every partition loaded): {first.line.seconds:.1f} s", flush=True)

        quiet = run_sync(setup, "quiet sync", args.events, spark.pid, changed=0)
        run_id = setup.instance.get_runs(limit=1)[0].run_id
        say_run(
            f"scheduled sync of {args.partitions} partitions, nothing new", quiet.line.seconds, events_of(setup, run_id)
        )

        keys = setup.instance.get_dynamic_partitions(setup.binding.partitions_name)
        run_id, seconds = run_asked(
            setup,
            {
                "dagster/backfill": "bench",
                "dagster/asset_partition_range_start": keys[0],
                "dagster/asset_partition_range_end": keys[-1],
            },
        )
        say_run(f"backfill run of {args.partitions} partitions, nothing new", seconds, events_of(setup, run_id))
    finally:
        if spark is not None:
            spark.stop()
        if feed is not None:
            stop_process(feed)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
