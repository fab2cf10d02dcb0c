#!/usr/bin/env python
"""A feed's loads under each table layout (`layout: clustered | partitioned | none`, issue #35), and which
writers can write each: the first load of many small partitions, a later incremental load, and an
operator's DELETE, compaction, append and RESTORE by delta-rs (what polars' `write_delta` and
dagster-deltalake write with) beside Spark SQL.

    .venv/bin/python benchmarks/bench_layout_loads.py                              # 2,000 x 10, each layout twice
    .venv/bin/python benchmarks/bench_layout_loads.py --partitions 500 --repeat 1   # a smaller, quicker run

A measurement, not a test. One classic local Spark session (`local_spark_session`, the project's
configuration), `local[2]`. Per repetition, each layout in turn (A B C A B C: contention from other work
hits all of them), each with a new table and its own demo feed server (`feedapi-dagster demo-server
--dialect published --partitions P --events P x E`, its own process):

* first load: the product's `FeedLoader.sync` into a new table (`FeedTable(layout=...)`: the feed's
  setting), from the loader's construction (the table's creation included) to the sync's return:
  discovery, the read (up to 16 read tasks), the Delta write, the state commit; the files it wrote;
* incremental load: 10 new events in each of 10 partitions (the demo's admin endpoint), then a new
  loader's sync (a run's: it reads the cursor of record from the table);
* the writers (the first repetition): delta-rs 1.6's `DeltaTable.delete` (a GDPR erasure of one row),
  `optimize.compact()`, `write_deltalake(mode="append")` of that row back and `restore` to the version
  before the incremental load, each timed, or the first line of its refusal; then Spark SQL's DELETE,
  OPTIMIZE and RESTORE of the same; after them a load reads the incremental events again, and the
  table must hold every event once (checked).

Every load is checked: the table holds each partition's events at positions 0..n-1 once, and its cursor
of record's positions add up to the rows. Each figure is printed as measured with `os.getloadavg()`.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
from bench_layout import load_text, say, stop
from bench_sync import start_feed_server  # the bundled demo feed in its own process

LAYOUTS = ("partitioned", "clustered", "none")
INCREMENT = 10  # new events per partition of the incremental load
CHANGED = 10  # partitions of the incremental load
EVENTS_PER_PARTITION = 10


@dataclass
class Result:
    layout: str
    first: list[float] = field(default_factory=list)
    files: list[int] = field(default_factory=list)
    incremental: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)  # 1-minute load averages at the figures
    writers: dict[str, str] = field(default_factory=dict)  # operation -> "0.05 s" or the refusal


def check(path: str, events: int) -> None:
    """Every partition's events at positions 0..n-1, once, and the cursor of record at their ends."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    from feedapi_dagster.lakehouse.cursor_record import read_committed_state

    columns = DeltaTable(path).to_pyarrow_table(columns=["partition_id", "position"])
    grouped = columns.group_by("partition_id").aggregate(
        [("position", "count"), ("position", "min"), ("position", "max"), ("position", "count_distinct")]
    )
    bad = grouped.filter(
        pc.or_(
            pc.not_equal(grouped["position_min"], 0),
            pc.or_(
                pc.not_equal(grouped["position_max"], pc.subtract(grouped["position_count"], 1)),
                pc.not_equal(grouped["position_count_distinct"], grouped["position_count"]),
            ),
        )
    )
    state = read_committed_state(path).state
    committed = sum(p.position for p in state.partitions.values())
    if columns.num_rows != events or bad.num_rows or committed != events:
        raise AssertionError(
            f"{path}: {columns.num_rows} rows (expected {events}), {bad.num_rows} partitions not 0..n-1 once, "
            f"cursor of record at {committed} events"
        )


def sync(spark, url: str, path: str, layout: str) -> float:
    from feedapi_dagster.lakehouse.feed_table import FeedTable
    from feedapi_dagster.lakehouse.loader import FeedLoader
    from feedapi_dagster.lakehouse.sink import DeltaSink
    from feedapi_dagster.protocol import feed_settings

    quiet = logging.getLogger("bench_layout_loads.load")
    quiet.setLevel(logging.WARNING)
    started = time.monotonic()
    feed = feed_settings(url=url, page_size_hint=100)
    FeedLoader(feed, DeltaSink(FeedTable(spark, path, layout=layout)), logger=quiet).sync()  # type: ignore[arg-type]
    return time.monotonic() - started


def first_line(error: Exception) -> str:
    return f"refused: {type(error).__name__}: {str(error).splitlines()[0][:120]}"


def writers(spark, path: str, before: int, result: Result) -> None:
    """An operator's delta-rs commits, then the same by Spark SQL, each RESTORE to `before` (the version
    before the incremental load); each timed, or its refusal."""
    from deltalake import DeltaTable, write_deltalake

    def attempt(name: str, operation) -> None:
        started = time.monotonic()
        try:
            operation()
        except Exception as error:  # noqa: BLE001 - the refusal is the figure
            result.writers[name] = first_line(error)
        else:
            result.writers[name] = f"{time.monotonic() - started:.2f} s"
        say(f"  {result.layout} {name}: {result.writers[name]}")

    one = "partition_id = 7 AND position = 3"
    row = DeltaTable(path).to_pyarrow_table(filters=[("partition_id", "=", 7), ("position", "=", 3)])
    attempt("delta-rs DELETE", lambda: DeltaTable(path).delete(one))
    attempt("delta-rs optimize.compact()", lambda: DeltaTable(path).optimize.compact())
    attempt("delta-rs write_deltalake(mode='append')", lambda: write_deltalake(path, row, mode="append"))
    attempt("delta-rs RESTORE", lambda: DeltaTable(path).restore(before))
    attempt("Spark SQL DELETE", lambda: spark.sql(f"DELETE FROM delta.`{path}` WHERE {one}").collect())
    attempt("Spark SQL OPTIMIZE", lambda: spark.sql(f"OPTIMIZE delta.`{path}`").collect())
    attempt("Spark SQL RESTORE", lambda: spark.sql(f"RESTORE TABLE delta.`{path}` TO VERSION AS OF {before}").collect())


def run_layout(spark, work: Path, layout: str, partitions: int, rep: int, result: Result, probe: bool) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable

    events = partitions * EVENTS_PER_PARTITION
    path = str(work / f"t-{layout}-{rep}")
    server, url = start_feed_server("feedapi", partitions, events, work / "feed-server.log")
    try:
        seconds = sync(spark, url, path, layout)
        files = len(pa.table(DeltaTable(path).get_add_actions(flatten=True)).column("path"))
        check(path, events)
        result.first.append(seconds)
        result.files.append(files)
        result.loads.append(os.getloadavg()[0])
        say(
            f"{layout} #{rep + 1} first load of {partitions:,} x {EVENTS_PER_PARTITION}: {seconds:.2f} s, {files} files (load {load_text()})"
        )
        admin = url.rsplit("/feed", 1)[0] + "/admin/append"
        for i in range(CHANGED):
            partition = i * partitions // CHANGED
            requests.post(admin, json={"count": INCREMENT, "partition": partition}, timeout=30).raise_for_status()
        events += CHANGED * INCREMENT
        before = DeltaTable(path).version()
        seconds = sync(spark, url, path, layout)
        check(path, events)
        result.incremental.append(seconds)
        result.loads.append(os.getloadavg()[0])
        say(f"{layout} #{rep + 1} incremental load ({CHANGED} x {INCREMENT} new): {seconds:.2f} s (load {load_text()})")
        if probe:
            writers(spark, path, before, result)
            sync(spark, url, path, layout)  # the RESTOREs undid the incremental load: read again, every event once
            check(path, events)
    finally:
        stop(server)
        shutil.rmtree(path, ignore_errors=True)


def table(results: dict[str, Result], partitions: int) -> str:
    def cell(values: list[float]) -> str:
        return " / ".join(f"{v:.2f}" for v in values)

    names = {"partitioned": "partitioned", "clustered": "clustered", "none": "none"}
    lines = [
        "| | " + " | ".join(names[r.layout] for r in results.values()) + " |",
        "|---" * (len(results) + 1) + "|",
        f"| first load, {partitions:,} x {EVENTS_PER_PARTITION} s (files) | "
        + " | ".join(f"{cell(r.first)} ({r.files[0]})" for r in results.values())
        + " |",
        f"| incremental load, {CHANGED} x {INCREMENT} new s | "
        + " | ".join(cell(r.incremental) for r in results.values())
        + " |",
    ]
    operations = next(iter(results.values())).writers
    for name in operations:
        lines.append(f"| {name} | " + " | ".join(r.writers.get(name, "-") for r in results.values()) + " |")
    lows = [min(r.loads) for r in results.values()]
    highs = [max(r.loads) for r in results.values()]
    lines.append(
        "| load average (1 min) | " + " | ".join(f"{a:.1f}-{b:.1f}" for a, b in zip(lows, highs, strict=True)) + " |"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=2000, help="feed partitions (2,000), 10 events each")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="in the order they take turns")
    parser.add_argument("--repeat", type=int, default=2, help="repetitions of each layout (2)")
    args = parser.parse_args()
    layouts = [name.strip() for name in args.layouts.split(",") if name.strip()]
    if unknown := set(layouts) - set(LAYOUTS):
        parser.error(f"unknown layouts {sorted(unknown)}: choose of {', '.join(LAYOUTS)}")
    reproduce = shlex.join([".venv/bin/python", "benchmarks/bench_layout_loads.py", *sys.argv[1:]])

    import deltalake
    import pyspark

    from feedapi_dagster.spark.sessions import local_spark_session

    work = Path(tempfile.mkdtemp(prefix="bench-layout-loads-"))
    started = time.monotonic()
    say(f"{reproduce}; temp folder {work}; {os.cpu_count()} cores, load {load_text()}")
    spark = local_spark_session(work_dir=work / "spark", master="local[2]", app_name="bench-layout-loads")
    results = {layout: Result(layout) for layout in layouts}
    try:
        # untimed: the JVM's first Delta commands and the data source's first read, for no layout's account
        for layout in layouts:
            run_layout(spark, work, layout, 20, -1, Result(layout), probe=False)
        for rep in range(args.repeat):
            for layout in layouts:
                run_layout(spark, work, layout, args.partitions, rep, results[layout], probe=rep == 0)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(reproduce)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, pyspark {pyspark.__version__} local[2], "
        f"delta-rs {deltalake.__version__}; run took {time.monotonic() - started:.0f} s; load now {load_text()}"
    )
    print()
    print(table(results, args.partitions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
