#!/usr/bin/env python
"""A producer that adds a field every 1,000 events, loaded into a `payload_form: columns` table: does a
load's time grow with its events, or with the schema changes it brings?

    .venv/bin/python benchmarks/bench_schema_drift.py                     # 100,000 events, 10 syncs
    .venv/bin/python benchmarks/bench_schema_drift.py --events 20000      # quick

Two feeds of the same events' count and partitions, each loaded by `--syncs` syncs of equal parts
(publish a part, sync) into a fresh columns table, in one local Spark session (Delta, the cached jars):

* `drift`: event i has the fields f0 .. f(i // every): a new field every `--every` events, so each sync
  brings `events / syncs / every` new columns (100 over the run by default);
* `steady`: every event has the fields the drifting feed ends with, from the first: one schema change,
  in the first sync.

Printed: each sync's seconds for both, their totals and the ratio drift / steady (1.0: the schema
changes cost nothing beyond their rows; the drifting events are smaller, so below 1.0 is expected),
the columns at the end. Then every row of the drifting table is compared with its event's JSON (each
field in its typed column, nothing rescued). Exit status 0 when the ratio is at most 1.2, 2 when not,
1 on errors.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RATIO_TARGET = 1.2


def drift_event(i: int, every: int) -> dict:
    return {"id": f"d-{i}", **{f"f{j}": i * 10 + j for j in range(i // every + 1)}}


def steady_event(i: int, fields: int) -> dict:
    return {"id": f"s-{i}", **{f"f{j}": i * 10 + j for j in range(fields)}}


def load_in_syncs(spark, path: str, events: list[dict], partitions: int, syncs: int) -> list[float]:
    """`events` published in `syncs` equal parts, each part synced into a columns table: each sync's seconds."""
    from feedapi_dagster.demo import DemoFeed, DemoFeedServer
    from feedapi_dagster.lakehouse.feed_table import FeedTable
    from feedapi_dagster.lakehouse.loader import FeedLoader
    from feedapi_dagster.lakehouse.sink import DeltaSink
    from feedapi_dagster.protocol import feed_settings

    feed = DemoFeed(partitions=partitions, events=0, seed=1)
    part = len(events) // syncs
    seconds = []
    with DemoFeedServer(feed, dialect="published") as server:
        for sync in range(syncs):
            for i, event in enumerate(events[sync * part : (sync + 1) * part]):
                feed.add_event(json.dumps(event), partition=i % partitions)
            loader = FeedLoader(
                feed_settings(url=server.url), DeltaSink(FeedTable(spark, path, payload_form="columns"))
            )
            started = time.perf_counter()
            loader.sync()
            seconds.append(time.perf_counter() - started)
    return seconds


def check_every_value(spark, path: str, fields: int) -> int:
    """Every row's fields in their typed columns, equal to its JSON; nothing rescued. The rows compared."""
    frame = spark.read.format("delta").load(path)
    columns = [f"f{j}" for j in range(fields)]
    missing = set(columns) - set(frame.columns)
    if missing:
        raise RuntimeError(f"fields with no column: {sorted(missing)[:5]}")
    rows = frame.select("payload", "_rescued_data", *columns).collect()
    for row in rows:
        payload = json.loads(row.payload)
        if row["_rescued_data"] is not None:
            raise RuntimeError(f"rescued: {row['_rescued_data']}")
        for column in columns:
            if row[column] != payload.get(column):
                raise RuntimeError(f"{column}: {row[column]!r} != {payload.get(column)!r} in {row.payload[:200]}")
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=1_000, help="a new field every N events")
    parser.add_argument("--syncs", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args(argv)
    from feedapi_dagster.spark.sessions import local_spark_session

    fields = (args.events - 1) // args.every + 1
    with tempfile.TemporaryDirectory(prefix="bench-drift-") as folder:
        spark = local_spark_session(work_dir=Path(folder) / "spark")
        # a warm-up load (JIT, Delta's first statements) so that neither feed pays for being first
        load_in_syncs(spark, str(Path(folder) / "warm"), [steady_event(i, 5) for i in range(2_000)], 2, 1)
        drift = load_in_syncs(
            spark,
            str(Path(folder) / "drift"),
            [drift_event(i, args.every) for i in range(args.events)],
            args.partitions,
            args.syncs,
        )
        steady = load_in_syncs(
            spark,
            str(Path(folder) / "steady"),
            [steady_event(i, fields) for i in range(args.events)],
            args.partitions,
            args.syncs,
        )
        print(f"{args.events:,} events in {args.syncs} syncs, {args.partitions} partitions, {fields} fields")
        print(f"{'sync':>4} {'new columns':>12} {'drift s':>9} {'steady s':>9}")
        for n, (d, s) in enumerate(zip(drift, steady, strict=True)):
            start, end = n * args.events // args.syncs, (n + 1) * args.events // args.syncs
            new = ((end - 1) // args.every + 1) - ((start - 1) // args.every + 1 if start else 0)
            print(f"{n + 1:>4} {new:>12} {d:9.2f} {s:9.2f}")
        ratio = sum(drift) / sum(steady)
        print(
            f"total: drift {sum(drift):.1f} s ({fields} schema changes), steady {sum(steady):.1f} s (1): "
            f"ratio {ratio:.2f} (target <= {RATIO_TARGET})"
        )
        started = time.perf_counter()
        compared = check_every_value(spark, str(Path(folder) / "drift"), fields)
        print(
            f"every value of {compared:,} rows equal to its JSON, nothing rescued "
            f"({len(spark.read.format('delta').load(str(Path(folder) / 'drift')).columns)} columns; "
            f"checked in {time.perf_counter() - started:.1f} s)"
        )
        spark.stop()
    return 0 if ratio <= RATIO_TARGET else 2


if __name__ == "__main__":
    sys.exit(main())
