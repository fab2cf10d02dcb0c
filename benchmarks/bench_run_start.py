#!/usr/bin/env python
"""What a forked run worker pays to open its Dagster instance, with and without the fork server's
storage warm-up (`feedapi_dagster/orchestration/warm_storage.py`), in one run.

    .venv/bin/python benchmarks/bench_run_start.py [--opens 7]

Each side runs in a fresh interpreter that first imports what the fork server preloads
(`ForkServerRunLauncher`'s DEFAULT_PRELOAD), then - the warm side only - the warm-up, then opens the
instance of a temp DAGSTER_HOME (the project's dagster.yaml) `--opens` times as a run worker does:
`DagsterInstance.from_ref` plus the run's event-log shard. Prints the median open of each side and
their ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = r'''
import importlib, json, sys, time, uuid
import dagster as dg
from feedapi_dagster.orchestration.launcher import DEFAULT_PRELOAD

for module in DEFAULT_PRELOAD:
    importlib.import_module(module)
if sys.argv[1] == "warm":
    importlib.import_module("feedapi_dagster.orchestration.warm_storage")
run_id = str(uuid.uuid4())
with dg.DagsterInstance.get() as instance:  # storages and the run's shard exist, as the daemon left them
    instance.all_logs(run_id)
    ref = instance.get_ref()
seconds = []
for _ in range(int(sys.argv[2])):
    started = time.perf_counter()
    instance = dg.DagsterInstance.from_ref(ref)
    instance.all_logs(run_id)
    seconds.append(time.perf_counter() - started)
    instance.dispose()
print(json.dumps(seconds))
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opens", type=int, default=7)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="bench-run-start-"))
    try:
        shutil.copy(ROOT / "dagster_project" / "dagster.yaml", home / "dagster.yaml")
        env = {**os.environ, "DAGSTER_HOME": str(home)}
        medians = {}
        for side in ("cold", "warm", "cold", "warm"):  # alternated: a machine that slows down hits both
            done = subprocess.run([sys.executable, "-W", "ignore", "-c", WORKER, side, str(args.opens)], env=env,
                                  cwd=ROOT, check=True, capture_output=True, text=True)
            seconds = json.loads(done.stdout.strip().splitlines()[-1])
            medians.setdefault(side, []).append(statistics.median(seconds))
            print(f"{side}: " + " ".join(f"{s * 1000:.0f}" for s in seconds) + " ms")
    finally:
        shutil.rmtree(home, ignore_errors=True)
    cold, warm = (statistics.median(medians[side]) for side in ("cold", "warm"))
    print(f"median open of a run worker's instance: without the warm-up {cold * 1000:.0f} ms, "
          f"with it {warm * 1000:.0f} ms; ratio {warm / cold:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
