#!/usr/bin/env python
"""Per-event cost of the NDJSON parse and the table's columns, in pure Python + msgspec + pyarrow.

    .venv/bin/python benchmarks/bench_parse.py            # 100,000 events, best of 7
    .venv/bin/python benchmarks/bench_parse.py --events 20000 --repeat 3

One response body of the bundled demo feed (published dialect, one partition, one page of `--events`
events; the body the demo server sends, checkpoints every 1-5 events) is read twice per repetition:
as one block, and in 256 KiB chunks as `FeedClient` reads a response. Timed separately:
`PageReader.runs` (lines into page runs: payloads as `bytes`, page ends, cursors) and
`EventBatch.add` + `EventBatch.to_arrow` (the runs into the Arrow columns of the table), which is
what a Spark task of the `feedapi` data source does per event besides HTTP. Prints the best and the
median repetition in ns per event.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import requests

from feedapi_dagster.demo.feedapi import DemoFeed, DemoFeedServer
from feedapi_dagster.protocol.feedapi.ndjson import PageReader
from feedapi_dagster.read.rows import EventBatch

CHUNK = 256 * 1024  # FeedClient's read size


def body(events: int) -> bytes:
    """One page of `events` events from the demo server, as sent."""
    with DemoFeedServer(DemoFeed(partitions=1, events=events), dialect="published", port=0) as server:
        token = requests.get(server.url, timeout=30).json()["token"]
        response = requests.get(
            f"{server.url}/events",
            timeout=60,
            params={"token": token, "partition": 0, "cursor": "_first", "pagesizehint": events},
        )
        response.raise_for_status()
        return response.content


def measure(block: bytes, chunked: bool) -> tuple[float, float, int]:
    """Seconds in PageReader.runs, seconds in EventBatch.add + to_arrow, events."""
    chunks = [block[i : i + CHUNK] for i in range(0, len(block), CHUNK)] if chunked else [block]
    started = time.perf_counter()
    runs = list(PageReader(0, "data").runs(chunks))
    parsed = time.perf_counter()
    batch, position = EventBatch("id"), 0
    for run in runs:
        batch.add(run.partition_id, position, run.raw_events, run.ends, run.cursors, run.payload_bytes)
        position += len(run.raw_events)
    table = batch.to_arrow()
    done = time.perf_counter()
    assert table.num_rows == position
    return parsed - started, done - parsed, position


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    block = body(args.events)
    events = measure(block, False)[2]
    print(
        f"one body: {events} events, {len(block) / 1e6:.1f} MB, {block.count(b'cursor')} checkpoints; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"{'ns per event':<44} {'best':>7} {'median':>7}")
    for chunked in (False, True):
        results = [measure(block, chunked) for _ in range(args.repeat)]
        for label, values in (
            ("PageReader.runs", [r[0] for r in results]),
            ("EventBatch.add + to_arrow", [r[1] for r in results]),
            ("both", [r[0] + r[1] for r in results]),
        ):
            where = "256 KiB chunks" if chunked else "one block"
            print(
                f"{label + ', ' + where:<44} {min(values) / events * 1e9:7.0f} "
                f"{statistics.median(values) / events * 1e9:7.0f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
