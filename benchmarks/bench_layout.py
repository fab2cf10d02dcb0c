#!/usr/bin/env python
"""A feed table's layout: a folder per feed partition (`PARTITIONED BY (partition_id)`, up to 0.1.0) against
liquid clustering on `partition_id` (`CLUSTER BY`, what `FeedTable.ensure_table` creates since) and no layout at all, for what the product does
with the table (issue #26).

    .venv/bin/python benchmarks/bench_layout.py                          # 2,000 x 10 and 16 x 25,000, 2 repetitions
    .venv/bin/python benchmarks/bench_layout.py --layouts partitioned,clustered,sorted,none --repeat 3
    .venv/bin/python benchmarks/bench_layout.py --shapes 10000x10 --layouts partitioned,clustered,sorted  # ~8 min
    .venv/bin/python benchmarks/bench_layout.py --shapes 200x10,4x1000 --repeat 1   # a smoke run

A measurement, not a test. One classic local Spark session (`local_spark_session`, the project's
configuration: Delta jars, 4 shuffle partitions, C1 JIT), `local[2]`. For each shape (P feed
partitions x E events), the bundled demo feed is served in its own process (`feedapi-dagster
demo-server --dialect published`, P x E events) and read once through the product's `feedapi` data
source (16 read tasks, partitions spread round-robin over them as `planning.task_groups` does for a
first load, the demo's ~200-byte JSON payloads; the demo spreads its events over the partitions
unevenly: E on average, a few partitions get none); the rows are kept (`localCheckpoint`) and every
table of the shape is written from them, so the HTTP read is not in any figure. Then, per repetition,
each layout in turn (A B C A B C: contention from other work hits all of them), each into a new table:

* create: `CREATE TABLE delta.`...` (the product's DDL) USING delta` + the layout:
  `partitioned` - `PARTITIONED BY (partition_id)`, statistics of `position` (what `FeedTable.ensure_table`
  created up to 0.1.0); `clustered` - `CLUSTER BY (partition_id)`, statistics of `partition_id, position` (Delta wants
  them of clustering columns), checked with `DESCRIBE DETAIL`'s `clusteringColumns`; `sorted` - the same
  clustered table, with every write's rows range-partitioned by `partition_id` into `--range-files`
  Spark tasks first (an extra shuffle; Delta 4.4 does not cluster rows on write, only `OPTIMIZE` does);
  `none` - no partitioning, statistics of `partition_id, position`. The default `--layouts` are
  `partitioned,clustered`: `sorted` adds a shuffle for no pruning at these sizes, and Delta 4.4 writes
  `none` as it writes a clustered table (only OPTIMIZE differs: it bin-packs);
* first write: all P x E rows appended in one commit by `FeedTable.write` (the product's write: the
  commit's columns, txnAppId/txnVersion, user metadata); files written (the commit's `numFiles`);
* incremental: 10 new events to each of 10 partitions (spread over the ids; all of them in a shape of
  fewer), one append from the tasks that hold them (a partition's rows in one task, as the source gives);
* positions, all partitions: rows and min/max(position) of every partition, as the positions check
  needs them: `log` - from the Delta log's file statistics by delta-rs (`stats._from_log`: a file is one
  partition's only in the `partitioned` layout); `spark` - the Spark aggregate `stats.partition_stats`
  falls back to (`partition_id IN (...)`, groupBy, count/min/max); `rs scan` - the two columns read by
  delta-rs (`to_pyarrow_dataset`) and aggregated by Arrow in this process; the same for the 10
  partitions of the incremental load (`log` / `spark`);
* last rows: `FeedTable.last_rows(version, 10 partitions)`, the recovery's query, and how many files a
  query of those 10 partitions reads (partition values, or min/max statistics of `partition_id`);
* dedup scan: `stats.duplicate_event_ids` of the 10 partitions (an at-least-once feed's check);
* rebuild: one partition's rows replaced in one commit (`FeedTable.write` with `replace`:
  `replaceWhere partition_id IN (x)`), with the files it removed and added;
* OPTIMIZE (the product's compaction; clustering for a clustered table) and the files left.

Every result is checked (rows, positions, last rows). Each figure is printed as measured with
`os.getloadavg()`; the table at the end gives, per shape and layout, the figures of each repetition
(`a / b`) and the 1-minute load average range. A warm-up round (each layout on 20 partitions of the
first shape, untimed) comes first, so that no layout pays the JVM's first Delta commands.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench_sync import start_feed_server  # the bundled demo feed in its own process, as the sync benchmark's

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BIN = Path(sys.executable).parent
LAYOUTS = ("partitioned", "clustered", "sorted", "none")
INCREMENT = 10  # new events per partition of the incremental load
CHANGED = 10  # partitions of the incremental load, of the recovery and dedup queries
READ_TASKS = 16  # the `feedapi` source's default
WARM_UP_PARTITIONS = 20
NAMES = {
    "partitioned": "PARTITIONED BY",
    "clustered": "CLUSTER BY",
    "sorted": "CLUSTER BY, sorted writes",
    "none": "neither",
}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def load() -> tuple[float, float, float]:
    return os.getloadavg()


def load_text(avg: tuple[float, float, float] | None = None) -> str:
    return " ".join(f"{x:.2f}" for x in (avg or load()))


# ----------------------------------------------------------------------------- the feed
def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Shape:
    partitions: int
    events: int  # per partition

    @property
    def name(self) -> str:
        return f"{self.partitions:,} x {self.events:,}"

    @classmethod
    def parse(cls, text: str) -> Shape:
        partitions, _, events = text.lower().partition("x")
        return cls(int(partitions), int(events))


@dataclass
class Data:
    """One shape's rows (kept), and what the checks expect of them."""

    rows: object  # the kept DataFrame of the feed's events (EVENT_SCHEMA)
    counts: dict[int, int]  # rows per partition (positions 0..n-1)
    changed: list[int]  # the incremental load's partitions
    rebuilt: int  # the partition the rebuild replaces
    increment: object  # the incremental load's rows


def read_feed(spark, shape: Shape, work: Path) -> tuple[subprocess.Popen, Data]:
    from pyspark.sql import functions as F

    t0 = time.monotonic()
    proc, url = start_feed_server(
        "feedapi", shape.partitions, shape.partitions * shape.events, work / "feed-server.log"
    )
    t1 = time.monotonic()
    page_size = min(5000, max(100, shape.events))
    rows = (
        spark.read.format("feedapi")
        .option("url", url)
        .option("pageSizeHint", str(page_size))
        .load()
        .localCheckpoint(eager=True)
    )
    stats = rows.groupBy("partition_id").agg(F.count("*"), F.min("position"), F.max("position")).collect()
    counts = {r[0]: r[1] for r in stats}
    if any((r[2], r[3]) != (0, r[1] - 1) for r in stats) or sum(counts.values()) != shape.partitions * shape.events:
        raise RuntimeError(
            f"the feed's rows are not {shape.name}: {len(counts)} partitions, "
            f"{sum(counts.values())} rows, positions not 0..n-1 in some"
        )
    # the demo feed spreads its events over the partitions by aggregate: E per partition on average
    say(
        f"{shape.name}: demo feed served in {t1 - t0:.1f} s, read by the feedapi source in "
        f"{time.monotonic() - t1:.1f} s ({rows.rdd.getNumPartitions()} Spark partitions, kept by localCheckpoint); "
        f"{len(counts)} partitions with rows, {min(counts.values())}-{max(counts.values())} events each"
    )
    ids = sorted(counts)
    changed = sorted({ids[i * len(ids) // CHANGED] for i in range(min(CHANGED, len(ids)))})
    rebuilt = max(set(ids) - set(changed)) if len(ids) > len(changed) else ids[-1]
    # 10 more events of each changed partition: its first event's payload at the next 10 positions, new ids
    shift = F.create_map(*[x for pid in changed for x in (F.lit(pid), F.lit(counts[pid]))])
    increment = (
        rows.where(F.col("partition_id").isin(changed) & (F.col("position") == 0))
        .crossJoin(spark.range(INCREMENT).withColumnRenamed("id", "k"))
        .withColumn("position", F.col("k") + shift[F.col("partition_id")])
        .withColumn("event_id", F.concat("event_id", F.lit("-again-"), F.col("k").cast("string")))
        .drop("k")
        # as a load's read tasks hand them over: a partition's rows in one task
        .repartition(READ_TASKS, "partition_id")
        .localCheckpoint(eager=True)
    )
    return proc, Data(rows, counts, changed, rebuilt, increment)


# ----------------------------------------------------------------------------- one layout, one table
def create_sql(path: str, layout: str) -> str:
    from feedapi_dagster.lakehouse.feed_table import TABLE_DDL

    if layout == "partitioned":  # FeedTable.ensure_table's up to 0.1.0
        return (
            f"CREATE TABLE delta.`{path}` ({TABLE_DDL}) USING delta PARTITIONED BY (partition_id) "
            "TBLPROPERTIES ('delta.dataSkippingStatsColumns' = 'position')"
        )
    stats = "TBLPROPERTIES ('delta.dataSkippingStatsColumns' = 'partition_id,position')"
    if layout in ("clustered", "sorted"):
        return f"CREATE TABLE delta.`{path}` ({TABLE_DDL}) USING delta CLUSTER BY (partition_id) {stats}"
    return f"CREATE TABLE delta.`{path}` ({TABLE_DDL}) USING delta {stats}"


@dataclass
class Result:
    layout: str
    rep: int
    values: dict[str, object] = field(default_factory=dict)
    loads: list[float] = field(default_factory=list)


class Run:
    """One layout's table of one shape: every step timed and checked."""

    def __init__(
        self,
        spark,
        path: str,
        layout: str,
        data: Data,
        result: Result,
        label: str,
        range_files: int,
        quiet: bool = False,
    ):
        from feedapi_dagster.lakehouse.feed_table import FeedTable

        self.spark, self.path, self.layout, self.data, self.result = spark, path, layout, data, result
        self.label, self.range_files, self.quiet = label, range_files, quiet
        self.table = FeedTable(spark, path, read_log="spark")  # the Spark paths (no ensure_table: its own DDL)
        self.txn = 0

    def timed(self, name: str, fn):
        start = time.monotonic()
        out = fn()
        seconds = time.monotonic() - start
        avg = load()
        self.result.values[name] = seconds
        self.result.loads.append(avg[0])
        if not self.quiet:
            say(f"{self.label} {name}: {seconds:.2f} s (load {load_text(avg)})")
        return out

    def note(self, name: str, value) -> None:
        self.result.values[name] = value
        if not self.quiet:
            say(f"{self.label} {name}: {value}")

    # -- helpers
    def write(self, rows, replace: tuple[int, ...] = ()) -> None:
        from feedapi_dagster.lakehouse.feed_table import Commit

        if self.layout == "sorted":
            rows = rows.repartitionByRange(self.range_files, "partition_id")
        self.txn += 1
        self.table.write(
            Commit(rows, json.dumps({"bench": self.layout, "txn": self.txn}), self.txn, replace), run_id="bench-layout"
        )

    def log(self):
        from deltalake import DeltaTable

        return DeltaTable(self.path)

    def last_metrics(self) -> dict[str, str]:
        return self.log().history(1)[0].get("operationMetrics", {})

    def add_actions(self) -> dict[str, list]:
        import pyarrow as pa

        return pa.table(self.log().get_add_actions(flatten=True)).to_pydict()

    def files_holding(self, partitions: list[int]) -> tuple[int, int]:
        """Files a query of `partitions` reads (by partition values or partition_id's min/max), of all."""
        actions = self.add_actions()
        wanted = set(partitions)
        if "partition.partition_id" in actions:
            hits = sum(1 for p in actions["partition.partition_id"] if int(p) in wanted)
        else:
            hits = sum(
                1
                for low, high in zip(actions["min.partition_id"], actions["max.partition_id"], strict=True)
                if any(low <= p <= high for p in wanted)
            )
        return hits, len(actions["path"])

    def expect_stats(self, found: dict, partitions, label: str) -> None:
        counts, changed = self.data.counts, set(self.data.changed)
        for pid in partitions:
            rows = counts[pid] + (INCREMENT if pid in changed else 0)
            got = found.get(pid)
            got = (got.rows, got.min_position, got.max_position) if hasattr(got, "rows") else got
            if got != (rows, 0, rows - 1):
                raise AssertionError(f"{self.label} {label}: partition {pid}: {got}, expected {(rows, 0, rows - 1)}")
        if len(found) != len(partitions):
            raise AssertionError(f"{self.label} {label}: {len(found)} partitions, expected {len(partitions)}")

    # -- the steps
    def run(self) -> None:
        from feedapi_dagster.lakehouse.delta_log import DeltaLog
        from feedapi_dagster.lakehouse.stats import _from_log, duplicate_event_ids, partition_stats

        data, spark = self.data, self.spark
        everything = sorted(data.counts)
        self.timed("create", lambda: spark.sql(create_sql(self.path, self.layout)).collect())
        detail = (
            spark.sql(f"DESCRIBE DETAIL delta.`{self.path}`").select("partitionColumns", "clusteringColumns").first()
        )
        expected = {
            "partitioned": (["partition_id"], []),
            "clustered": ([], ["partition_id"]),
            "sorted": ([], ["partition_id"]),
            "none": ([], []),
        }[self.layout]
        if (list(detail[0]), list(detail[1] or [])) != expected:
            raise AssertionError(
                f"{self.label}: DESCRIBE DETAIL gives partitionColumns {detail[0]}, "
                f"clusteringColumns {detail[1]}; expected {expected}"
            )
        self.note(
            "layout (DESCRIBE DETAIL)", f"partitionColumns {list(detail[0])}, clusteringColumns {list(detail[1] or [])}"
        )

        self.timed("first write", lambda: self.write(data.rows))
        self.note("first write files", int(self.last_metrics()["numFiles"]))
        self.timed("incremental", lambda: self.write(data.increment))
        self.note("incremental files", int(self.last_metrics()["numFiles"]))
        version = self.log().version()

        # the positions check
        if self.layout == "partitioned":
            found = self.timed("positions, all: log", lambda: _from_log(DeltaLog(self.path), set(everything)))
            self.expect_stats(found, everything, "log stats")
            found = self.timed("positions, 10: log", lambda: _from_log(DeltaLog(self.path), set(data.changed)))
            self.expect_stats(found, data.changed, "log stats")
        found = self.timed("positions, all: spark", lambda: partition_stats(self.table, everything))
        self.expect_stats(found, everything, "Spark aggregate")
        found = self.timed("positions, 10: spark", lambda: partition_stats(self.table, data.changed))
        self.expect_stats(found, data.changed, "Spark aggregate")
        found = self.timed("positions, all: rs scan", lambda: rs_scan_stats(self.path))
        self.expect_stats(found, everything, "delta-rs scan")

        # recovery, dedup
        hits, files = self.files_holding(data.changed)
        self.note("files read for 10 partitions", f"{hits} of {files}")
        last = self.timed("last rows", lambda: self.table.last_rows(version, data.changed))
        want = {pid: data.counts[pid] + INCREMENT - 1 for pid in data.changed}
        if {pid: pos for pid, (pos, _) in last.items()} != want:
            raise AssertionError(f"{self.label} last rows: {last}")
        dups = self.timed("dedup scan", lambda: duplicate_event_ids(self.table, data.changed))
        if dups:
            raise AssertionError(f"{self.label} dedup: {dups}")

        # rebuild of one partition
        from pyspark.sql import functions as F

        rebuilt = data.rebuilt
        self.timed("rebuild", lambda: self.write(data.rows.where(F.col("partition_id") == rebuilt), (rebuilt,)))
        metrics = self.last_metrics()
        self.note(
            "rebuild files removed/added", f"{metrics.get('numRemovedFiles', '?')}/{metrics.get('numFiles', '?')}"
        )
        total = sum(data.counts.values()) + INCREMENT * len(data.changed)
        found = rs_scan_stats(self.path)  # untimed: delta-rs reads the table's rows faster than Spark here
        check = (sum(n for n, _, _ in found.values()), found.get(rebuilt))
        if check != (total, (data.counts[rebuilt], 0, data.counts[rebuilt] - 1)):
            raise AssertionError(
                f"{self.label} after the rebuild: {check}, expected {total} rows, partition "
                f"{rebuilt} 0..{data.counts[rebuilt] - 1}"
            )

        self.timed("OPTIMIZE", lambda: spark.sql(f"OPTIMIZE delta.`{self.path}`").collect())
        hits, files = self.files_holding(data.changed)
        self.note("files after OPTIMIZE", f"{files}, {hits} for 10 partitions")


def rs_scan_stats(path: str) -> dict[int, tuple[int, int, int]]:
    """Rows, min and max position of every partition: the two columns read by delta-rs, grouped by Arrow."""
    from deltalake import DeltaTable

    columns = DeltaTable(path).to_pyarrow_dataset().to_table(columns=["partition_id", "position"])
    grouped = (
        columns.group_by("partition_id")
        .aggregate([("position", "count"), ("position", "min"), ("position", "max")])
        .to_pydict()
    )
    return {
        pid: (n, low, high)
        for pid, n, low, high in zip(
            grouped["partition_id"],
            grouped["position_count"],
            grouped["position_min"],
            grouped["position_max"],
            strict=True,
        )
    }


# ----------------------------------------------------------------------------- the table
COLUMNS = [  # (header, value keys, format)
    ("first write s (files)", ["first write", "first write files"]),
    ("incremental s (files)", ["incremental", "incremental files"]),
    (
        "positions, all: log / Spark / rs scan s",
        ["positions, all: log", "positions, all: spark", "positions, all: rs scan"],
    ),
    ("positions, 10: log / Spark s", ["positions, 10: log", "positions, 10: spark"]),
    ("last rows, 10 s (files read)", ["last rows", "files read for 10 partitions"]),
    ("dedup scan, 10 s", ["dedup scan"]),
    ("rebuild 1 s (files removed/added)", ["rebuild", "rebuild files removed/added"]),
    ("OPTIMIZE s (files after)", ["OPTIMIZE", "files after OPTIMIZE"]),
]


def fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if value < 10 else f"{value:.1f}"
    return str(value)


def cell(results: list[Result], keys: list[str]) -> str:
    """Each repetition's figures, `a / b`, the counts in brackets (from the first repetition)."""
    timed = [k for k in keys if k in results[0].values and isinstance(results[0].values[k], float)]
    counts = [k for k in keys if k in results[0].values and not isinstance(results[0].values[k], float)]
    parts = []
    for key in keys:
        if key in timed:
            parts.append(" / ".join(fmt(r.values.get(key)) for r in results))
        elif key not in counts and key.startswith("positions"):
            parts.append("-")
    text = " \u2016 ".join(parts) if len(parts) > 1 else (parts[0] if parts else "-")
    if counts:
        text += " (" + "; ".join(fmt(results[0].values[k]) for k in counts) + ")"
    return text


def table(all_results: dict[str, dict[str, list[Result]]]) -> str:
    header = ["shape", "layout", "load avg (1 min)", *(c[0] for c in COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for shape, by_layout in all_results.items():
        for layout, results in by_layout.items():
            loads = [x for r in results for x in r.loads]
            row = [
                shape,
                NAMES[layout],
                f"{min(loads):.1f}-{max(loads):.1f}",
                *(cell(results, keys) for _, keys in COLUMNS),
            ]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes",
        default="2000x10,16x25000",
        help="feed partitions x events per partition, comma-separated (default 2000x10,16x25000)",
    )
    parser.add_argument(
        "--layouts", default="partitioned,clustered", help=f"of {','.join(LAYOUTS)}, in the order they take turns"
    )
    parser.add_argument("--repeat", type=int, default=2, help="repetitions of each layout per shape (2)")
    parser.add_argument(
        "--range-files",
        type=int,
        default=4,
        help="`sorted`: Spark tasks (files) a write's rows are range-partitioned into (4)",
    )
    parser.add_argument("--no-warm-up", action="store_true", help="skip the untimed warm-up round")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (tables, logs)")
    args = parser.parse_args()
    shapes = [Shape.parse(s) for s in args.shapes.split(",") if s.strip()]
    layouts = [name.strip() for name in args.layouts.split(",") if name.strip()]
    if unknown := set(layouts) - set(LAYOUTS):
        parser.error(f"unknown layouts {sorted(unknown)}: choose of {', '.join(LAYOUTS)}")
    reproduce = shlex.join([".venv/bin/python", "benchmarks/bench_layout.py", *sys.argv[1:]])

    import deltalake
    import pyspark

    from feedapi_dagster.read.registration import register_feed_source
    from feedapi_dagster.spark.sessions import local_spark_session

    work = Path(tempfile.mkdtemp(prefix="bench-layout-"))
    started = time.monotonic()
    say(f"{reproduce}; temp folder {work}; {os.cpu_count()} cores, load {load_text()}")
    spark = local_spark_session(work_dir=work / "spark", master="local[2]", app_name="bench-layout")
    register_feed_source(spark)
    say(
        f"Spark {pyspark.__version__} (local[2]) up in {time.monotonic() - started:.1f} s, delta-rs "
        f"{deltalake.__version__}"
    )
    results: dict[str, dict[str, list[Result]]] = {}
    server = None
    try:
        for index, shape in enumerate(shapes):
            server, data = read_feed(spark, shape, work)
            if index == 0 and not args.no_warm_up:
                warm_up(spark, data, layouts, work, args.range_files)
            by_layout = results.setdefault(shape.name, {layout: [] for layout in layouts})
            for rep in range(args.repeat):
                for layout in layouts:
                    path = str(work / f"t-{shape.partitions}x{shape.events}-{layout}-{rep}")
                    result = Result(layout, rep)
                    Run(spark, path, layout, data, result, f"{shape.name} {layout} #{rep + 1}", args.range_files).run()
                    by_layout[layout].append(result)
                    if not args.keep:
                        shutil.rmtree(path, ignore_errors=True)
            data.rows.unpersist()
            stop(server)
            server = None
    finally:
        stop(server)
        spark.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(f"{reproduce}")
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, pyspark {pyspark.__version__} local[2], "
        f"delta-rs {deltalake.__version__}; run took {time.monotonic() - started:.0f} s; load now {load_text()}"
    )
    print("(seconds of each repetition, a / b; counts in brackets from the first; \u2016 separates methods)")
    print()
    print(table(results))
    return 0


def warm_up(spark, data: Data, layouts: list[str], work: Path, range_files: int) -> None:
    """Each layout once on a few partitions, untimed: the JVM's first Delta commands of each kind."""
    from pyspark.sql import functions as F

    ids = sorted(data.counts)[:WARM_UP_PARTITIONS]
    small = Data(
        data.rows.where(F.col("partition_id").isin(ids)),
        {p: data.counts[p] for p in ids},
        [p for p in data.changed if p in ids] or ids[:1],
        ids[-1],
        data.increment.where(F.col("partition_id").isin(ids)),
    )
    if small.rebuilt in small.changed and len(ids) > 1:
        small.rebuilt = max(set(ids) - set(small.changed))
    start = time.monotonic()
    for layout in layouts:
        path = str(work / f"warm-up-{layout}")
        Run(spark, path, layout, small, Result(layout, -1), f"warm-up {layout}", range_files, quiet=True).run()
        shutil.rmtree(path, ignore_errors=True)
    say(f"warm-up ({len(ids)} partitions, each layout once): {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
