#!/usr/bin/env python
"""How fast can a `payload_form: columns` load be, beside a `json` load, on this machine? (issue #37)

    .venv/bin/python benchmarks/bench_columns_floor.py                    # 16 partitions x 25,000 events
    .venv/bin/python benchmarks/bench_columns_floor.py --events 40000     # quick

One embedded Spark Connect server (C2, as `feedapi-dagster dev` starts it), the bundled demo feed on
127.0.0.1. First the loads as a run makes them (`FeedLoader.load`, no Dagster around it), json and
columns taking turns, each into a fresh table, `--repeat` times each. Then, on the same server and with
the last json table's rows kept by Spark (`localCheckpoint`, so that no feed read is in them), the work
a columns load cannot do without, each timed `--repeat` times:

* the json rows written to a new Delta table (what json's write costs);
* the same rows typed by one `from_json` of each payload with the columns table's own payload schema,
  written to a new Delta table (the least a typed write costs: one parse, typed Parquet, Delta's stats);
* each payload parsed once (`parse_json`, Spark's `noop` sink), less the rows read alone: the least an
  inference of the columns can cost, before it looks at a single value's type.

The bound: a columns load that did only that work more than a json load would take json's load plus
(typed write - json write) plus the parse; printed as its events/s over json's. Issue #37's target is
0.8x. The bound leaves out what the real load also needs (the shape of each value, the rows kept for
the second look, the rescue checks), so the real load can only be slower than it.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from feedapi_dagster.demo.feedapi.demo_feed import DemoFeed
from feedapi_dagster.demo.feedapi.server import DemoFeedServer
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.lakehouse.load_settings import LoadSettings
from feedapi_dagster.lakehouse.loader import FeedLoader
from feedapi_dagster.lakehouse.payload_form import data_column
from feedapi_dagster.lakehouse.typed_columns import sql_string
from feedapi_dagster.planning.column_types import quoted
from feedapi_dagster.protocol.feedapi.settings import FeedApiSettings
from feedapi_dagster.spark.connect_server import port_open
from feedapi_dagster.spark.embedded import ensure_embedded_server
from feedapi_dagster.spark.sessions import spark_session
from feedapi_dagster.spark.settings import SparkSettings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("bench_columns_floor")
PORT = 15990


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def timed(job: Callable[[int], object], repeat: int) -> list[float]:
    """The seconds of each of `repeat` calls of `job`, which is given the attempt's number."""
    seconds = []
    for attempt in range(repeat):
        started = time.perf_counter()
        job(attempt)
        seconds.append(time.perf_counter() - started)
    return seconds


def typed_rows(spark: SparkSession, kept: DataFrame, columns_table: str) -> DataFrame:
    """`kept` with the columns table's payload columns: one `from_json` of `payload` (a projection of its
    own, as `typed_columns` does: each row parsed once), its fields under their columns' names."""
    from pyspark.sql import functions as F

    from feedapi_dagster.planning.payload_columns import payload_columns_of

    columns = payload_columns_of(spark.read.format("delta").load(columns_table).schema.jsonValue())
    fields = ", ".join(f"{quoted(c.key)}: {c.type.ddl()}" for c in columns)
    parsed = kept.select("*", F.expr(f"from_json(payload, {sql_string(f'STRUCT<{fields}>')})").alias("parsed"))
    return parsed.select(*kept.columns, *(F.col("parsed").getField(c.key).alias(c.name) for c in columns))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--events", type=int, default=400_000, help="in all partitions")
    parser.add_argument("--page-size", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-columns-floor-"))
    if port_open(PORT):
        raise SystemExit(f"port {PORT} is taken")
    say(f"work dir {work}; starting the Spark Connect server on port {PORT}")
    try:
        with ensure_embedded_server(PORT, work_dir=work / "spark"):  # stopped on the way out
            return measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(args: argparse.Namespace, work: Path) -> int:
    """The loads, then the floors, on the server started on `PORT`; prints them."""
    from pyspark import StorageLevel

    spark = spark_session(SparkSettings(mode="embedded", port=PORT))
    feed = DemoFeed(partitions=args.partitions, events=args.events)
    loads: dict[str, list[float]] = {"json": [], "columns": []}
    with DemoFeedServer(feed, dialect="published") as server:
        settings = FeedApiSettings(url=server.url, page_size_hint=args.page_size)
        for attempt in range(args.repeat + 1):  # the first of each form pays its JIT: not counted
            for form, seconds in loads.items():
                table = FeedTable(spark, str(work / f"{form}-{attempt}"), payload_form=form)
                loader = FeedLoader.into(table, settings, LoadSettings(), run_id=None, logger=log)
                started = time.perf_counter()
                loader.load(range(args.partitions))
                took = time.perf_counter() - started
                say(f"load #{attempt} {form}: {took:.2f} s{' (first: not counted)' if attempt == 0 else ''}")
                if attempt:
                    seconds.append(took)
    last = args.repeat
    rows = spark.read.format("delta").load(str(work / f"json-{last}")).drop("loaded_at", "run_id")
    kept = rows.localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY)
    typed = typed_rows(spark, kept, str(work / f"columns-{last}"))
    floors = {
        "the rows read alone (noop)": lambda n: kept.write.format("noop").mode("overwrite").save(),
        "each payload parsed once (parse_json, noop)": lambda n: (
            kept.withColumn("data", data_column()).write.format("noop").mode("overwrite").save()
        ),
        "json rows -> Delta": lambda n: kept.write.format("delta").save(str(work / f"floor-json-{n}")),
        "typed by one from_json -> Delta": lambda n: typed.write.format("delta").save(str(work / f"floor-typed-{n}")),
    }
    found: dict[str, float] = {}
    for name, job in floors.items():
        seconds = timed(job, args.repeat + 1)[1:]  # the first pays its JIT: not counted
        found[name] = statistics.median(seconds)
        say(f"{name}: {' / '.join(f'{s:.2f}' for s in seconds)} s")
    json_load, columns_load = statistics.median(loads["json"]), statistics.median(loads["columns"])
    parse = found["each payload parsed once (parse_json, noop)"] - found["the rows read alone (noop)"]
    typing = found["typed by one from_json -> Delta"] - found["json rows -> Delta"]
    bound = json_load + typing + parse
    print()
    print(f"{args.partitions} x {args.events // args.partitions:,} events; {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"json load (median)             {json_load:6.2f} s")
    print(f"columns load (median)          {columns_load:6.2f} s   columns / json {json_load / columns_load:.2f}x")
    print(f"typed write - json write       {typing:6.2f} s")
    print(f"one parse of every payload     {parse:6.2f} s")
    print(f"bound: json + both             {bound:6.2f} s   at best {json_load / bound:.2f}x json (target 0.8)")
    print(f"the real columns load's excess over the bound: {columns_load - bound:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
