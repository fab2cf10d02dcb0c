#!/usr/bin/env python
"""A feed as a Spark Structured Streaming source (issue 29), in one run on one embedded Spark Connect
server: the events/s of an `availableNow` catch-up beside the batch load of the same feed, then the
latency from an event's publication to its row in Delta at a steady publish rate with a
`processingTime` trigger; each for Delta's streaming sink and for the stream the Dagster job
`feedapi_<feed>_stream` runs (`FeedStream`: each micro-batch's rows and the cursor of record in one
commit, through `foreachBatch`).

    .venv/bin/python benchmarks/bench_stream.py                  # 16 x 12,500 events; 60 s at 1,000 events/s
    .venv/bin/python benchmarks/bench_stream.py --quick          # 16 x 2,000 events, 1 round; 15 s
    .venv/bin/python benchmarks/bench_stream.py --trigger-ms 250 --seconds 120 --keep

In order (benchmarks/README.md says what each line measures):

1. the embedded Spark Connect server started (timed apart, counted in neither mode), a Connect
   session of it (`sessions.spark_session`, as a run makes one), the `feedapi` data source registered;
2. **catch-up**: one generated feed (the bundled demo server in its own process, published dialect,
   `--partitions` x `--events`) read from `_first` by the batch load (`FeedLoader(...).sync()`) into
   one Delta table and by `spark.readStream.format("feedapi")` + `stream_to_delta(...)` with
   `trigger(availableNow=True)` into another (and, with `--max-events-per-trigger`, a third, the same
   stream in micro-batches of at most that many events), by `FeedStream(...).start({"availableNow":
   True})` into another, the query the Dagster stream job runs (with `catch_up: false`, or after its
   catch-up), and by `FeedLoader.into(...).load(None)` into a last one, the stream job's catch-up (its
   default: the backlog read by a batch load). Each table is created untimed first (the
   same `FeedTable.ensure_table` every mode runs). A warm-up round (printed, not counted) and then
   `--repeat` rounds, the order of the modes alternated from round to round; each table's rows
   checked against the feed's event count, and once the tables compared row for row;
3. **latency**: a second feed (`--stream-partitions`, no events), a `processingTime` query
   (`--trigger-ms`) into a Delta table, then `--rate` events/s published for `--seconds` by this
   process through the demo server's `POST /admin/append` (a batch of events to one partition every
   `--tick-ms`, partitions in turn), each POST's send time recorded. Once every event is in Delta:
   per event, its Delta commit (the row's `_metadata.file_name` among the `add` actions of the
   `_delta_log/<version>.json` commits) and that commit's `commitInfo.timestamp`, less its
   publication; every partition's rows checked against what the server published there, in order;
   the micro-batches' `durationMs` from `query.recentProgress`. Then the same for a `FeedStream` with
   the same trigger on a third feed (fresh, `--stream-partitions`), into a table of its own; its
   commits do not name their micro-batch (their `txn` is the sink's): each is the micro-batch's that
   started last before it. Its `addBatch` (`MicroBatchCommit`) is cut at the moments its commit left:
   the rows' `loaded_at` (`FeedTable.write` called), the last Parquet file, `commitInfo.timestamp`,
   the log file's mtime.

Why the admin endpoint and not the demo server's `--publish-rate`: the server's publisher appends a
tenth of a second's worth at a time in its own thread and records no times, so an event's publication
would only be known to within 100 ms. Here each POST's send time is recorded: its events are in the
feed at most one round trip later (printed), and latencies counted from the send are never too short.

Everything started here (feed servers, the Spark server and its workers) is stopped at the end, also
on errors, ctrl-C and SIGTERM. Exit status 0, or 1 on errors (a check that failed included).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import logging
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
from bench_sync import load_average, say, start_feed_server
from procstat import find_free_port, release_spark_port, stop_process

from feedapi_dagster.lakehouse.feed_stream import FeedStream, stream_to_delta
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.lakehouse.load_settings import LoadSettings
from feedapi_dagster.lakehouse.loader import FeedLoader
from feedapi_dagster.lakehouse.sink import DeltaSink
from feedapi_dagster.protocol import FeedSettings, feed_settings
from feedapi_dagster.read.datasource import FeedSourceOptions
from feedapi_dagster.read.registration import register_feed_source
from feedapi_dagster.read.stream_source import MAX_EVENTS_PER_TRIGGER
from feedapi_dagster.spark.embedded import ensure_embedded_server
from feedapi_dagster.spark.sessions import spark_session
from feedapi_dagster.spark.settings import SparkSettings

# the modes: the batch load, Delta's streaming sink (`stream_to_delta`), the stream a Dagster stream
# run runs (`FeedStream`: each micro-batch's rows and the cursor of record in one commit, `foreachBatch`),
# and the Dagster stream job's catch-up (`catch_up`, its default: a batch load of every partition first)
BATCH, STREAM, FEED_STREAM, JOB_CATCH_UP = "batch", "stream", "feedstream", "jobcatchup"
FEED_STREAM_MODE = "stream as Dagster runs it (FeedStream: foreachBatch + cursor of record)"
JOB_CATCH_UP_MODE = "the stream job's catch-up (catch_up: FeedLoader.load of every partition)"

# the micro-batches' timings kept by Spark per query (default 100): the latency run may have more
PROGRESS_KEPT = "10000"
# `durationMs` of a micro-batch, in the order Spark runs them (`triggerExecution` is the whole)
STEPS = ("latestOffset", "queryPlanning", "getBatch", "walCommit", "addBatch", "commitOffsets")
STEP_NAMES = {
    "latestOffset": "latestOffset: discovery, the feed read by the driver's source",
    "queryPlanning": "queryPlanning",
    "getBatch": "getBatch: the micro-batch's DataFrame",
    "walCommit": "walCommit: offsets logged in the checkpoint",
    "addBatch": "addBatch: Spark job (rows to Parquet) + Delta commit",
    "commitOffsets": "commitOffsets: the checkpoint's commit log",
}
FEED_STREAM_ADD_BATCH = "addBatch: MicroBatchCommit (foreachBatch): the rows and the cursor of record in one commit"
# a FeedStream's addBatch is `MicroBatchCommit` (foreachBatch); its moments, from Delta's log and the
# rows: when `FeedTable.write` made the rows' `loaded_at`, the commit's files, its commitInfo, its log file
ADD_BATCH_PARTS = (
    "persist, the offsets row collected (a Spark job: the micro-batch cached), the cursor of record read "
    "(Delta history), until FeedTable.write (the rows' loaded_at)",
    "the write's Spark job, the rows to Parquet (its last file's modificationTime)",
    "Delta's commit, from the last file to commitInfo.timestamp",
    "the log entry written (its _delta_log file's mtime)",
    "Delta's post-commit work (a log checkpoint after every 10th commit), the history read that finds the "
    "commit (DeltaSink._landed), unpersist: to addBatch's end",
)


class CheckFailed(Exception):
    """A check of the run failed: a table does not hold what the feed holds, a query failed or hung."""


# ----------------------------------------------------------------------------- catch-up
@dataclass
class Load:
    """One read of the catch-up feed into a table."""

    mode: str
    seconds: float
    events: int
    table_seconds: float  # its table created, untimed
    steps: list[str] = field(default_factory=list)  # where the seconds went

    @property
    def rate(self) -> float:
        return self.events / self.seconds


class _Lines(logging.Handler):
    """The loader's log lines about the whole load, with the seconds since `started`."""

    def __init__(self, started: float):
        super().__init__(logging.INFO)
        self.started = started
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if not message.startswith("partition "):  # the load's lines, not each partition's
            self.lines.append(f"{time.perf_counter() - self.started:6.2f} s  {message}")


def created_table(spark, path: str) -> float:
    started = time.perf_counter()
    FeedTable(spark, path).ensure_table()
    return time.perf_counter() - started


def batch_load(spark, feed: FeedSettings, path: str, events: int) -> Load:
    """The feed read by the batch load (`FeedLoader.sync`: one Spark job reads and writes the rows,
    then the cursors' commit), timed from the loader's construction to the sync's return."""
    return logged_load(
        spark,
        path,
        events,
        "batch load (FeedLoader.sync)",
        lambda logger: FeedLoader(feed, DeltaSink(FeedTable(spark, path)), logger=logger).sync(),
    )


def job_catch_up(spark, feed: FeedSettings, path: str, events: int) -> Load:
    """The feed read as the Dagster stream job reads a backlog (`catch_up`, `FeedApiResource._catch_up`):
    `FeedLoader.into(...).load(None)`, every partition the discovery lists, timed from the loader's
    construction to the load's return (its outcome's cursor of record read included)."""
    return logged_load(
        spark,
        path,
        events,
        JOB_CATCH_UP_MODE,
        lambda logger: FeedLoader.into(
            FeedTable(spark, path), feed, LoadSettings(), run_id="bench-stream-job", logger=logger
        ).load(None),
    )


def logged_load(spark, path: str, events: int, mode: str, load: Callable[[logging.Logger], object]) -> Load:
    """`load(logger)` into a new table at `path`, timed, with the lines it logged."""
    table_seconds = created_table(spark, path)
    logger = logging.getLogger(f"bench_stream.{mode}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    started = time.perf_counter()
    lines = _Lines(started)
    logger.addHandler(lines)
    try:
        load(logger)
    finally:
        logger.removeHandler(lines)
    return Load(mode, time.perf_counter() - started, events, table_seconds, lines.lines)


def stream_reader(spark, feed: FeedSettings, max_events_per_trigger: int | None = None):
    """`spark.readStream.format("feedapi")` with the feed's own options (those a batch load's read gets)."""
    reader = spark.readStream.format("feedapi").options(**FeedSourceOptions(feed=feed).spark_options())
    if max_events_per_trigger:
        reader = reader.option(MAX_EVENTS_PER_TRIGGER, str(max_events_per_trigger))
    return reader.load()


def available_now(spark, feed: FeedSettings, path: str, events: int, max_events_per_trigger: int | None) -> Load:
    """The feed read by an availableNow query into a new table (its own checkpoint), timed from the
    query's definition to its end."""
    table_seconds = created_table(spark, path)
    started = time.perf_counter()
    writer = stream_to_delta(stream_reader(spark, feed, max_events_per_trigger), path, f"{path}-checkpoint")
    query = writer.trigger(availableNow=True).start()
    query_started = time.perf_counter()
    batches = ended_batches(query, path, started)
    seconds = time.perf_counter() - started
    mode = "stream availableNow" + (
        f", maxEventsPerTrigger {max_events_per_trigger:,}" if max_events_per_trigger else ""
    )
    steps = [
        f"{query_started - started:6.2f} s  the query defined and its start() returned",
        *micro_batch_steps(batches, seconds),
    ]
    return Load(mode, seconds, events, table_seconds, steps)


def feed_stream_available_now(spark, feed: FeedSettings, path: str, events: int) -> Load:
    """The feed read by a `FeedStream` availableNow query into a new table (its own checkpoint), as the
    Dagster job `feedapi_<feed>_stream` runs it: timed from the stream's construction (its `DeltaSink`,
    the source registered) through `start` (the feed's discovery, the cursor of record read) to the
    query's end."""
    table_seconds = created_table(spark, path)
    started = time.perf_counter()
    stream = FeedStream(feed, FeedTable(spark, path), run_id="bench-stream", checkpoint=f"{path}-checkpoint")
    constructed = time.perf_counter()
    query = stream.start({"availableNow": True})
    query_started = time.perf_counter()
    batches = ended_batches(query, path, started)
    seconds = time.perf_counter() - started
    steps = [
        f"{constructed - started:6.2f} s  FeedStream(...) constructed (its DeltaSink: ensure_table; the source registered)",
        f"{query_started - constructed:6.2f} s  its start() returned (the feed's discovery, the active queries listed, "
        "the cursor of record read, the query started)",
        *micro_batch_steps(batches, seconds, offsets_rows=True),
    ]
    commits = commits_by_file(Path(path))
    of_batch = commits_of_batches(commits.values(), [b for b in batches if events_read(b, FEED_STREAM)])
    written = write_moments(spark, Path(path), commits)
    parts = [
        add_batch_parts(b, of_batch[b["batchId"]], written[of_batch[b["batchId"]].version])
        for b in batches
        if b["batchId"] in of_batch
    ]
    steps.append(
        f"  of addBatch, {len(parts)} micro-batch(es) with a commit, summed (approx.: the moments of Delta's log):"
    )
    steps += [f"    {sum(p[i] for p in parts):6.2f} s  {name}" for i, name in enumerate(ADD_BATCH_PARTS)]
    return Load(FEED_STREAM_MODE, seconds, events, table_seconds, steps)


def ended_batches(query, path: str, started: float) -> list[dict]:
    """An availableNow query awaited to its end (30 minutes at most); its micro-batches with rows."""
    deadline = started + 1800
    while not query.awaitTermination(5):  # short waits: a signal's handler runs between them
        if time.perf_counter() > deadline:
            query.stop()
            raise CheckFailed(f"the availableNow query into {path} did not end in 30 minutes")
    if query.exception() is not None:
        raise CheckFailed(f"the availableNow query into {path} failed: {query.exception()}")
    return [b for b in map(progress_of, query.recentProgress) if b["numInputRows"]]


def progress_of(progress) -> dict:
    """A `StreamingQueryProgress` as a plain dict of what is read here (`numInputRows`: its property,
    which sums the sources' where the progress's JSON has no total)."""
    return {
        "batchId": progress["batchId"],
        "timestamp": progress["timestamp"],
        "durationMs": dict(progress["durationMs"]),
        "numInputRows": progress.numInputRows,
    }


def micro_batch_steps(batches: list[dict], seconds: float, offsets_rows: bool = False) -> list[str]:
    """Where an availableNow query's seconds went: its micro-batches' steps, summed. `offsets_rows`: a
    FeedStream's source adds a row of offsets to each micro-batch (`checkpointRows`), not an event."""
    total = {step: sum(b["durationMs"].get(step, 0) for b in batches) / 1000 for step in (*STEPS, "triggerExecution")}
    rows = sum(b["numInputRows"] for b in batches)
    described = f"{rows - len(batches):,} events (+ an offsets row each)" if offsets_rows else f"{rows:,} rows"
    lines = [f"{len(batches)} micro-batch(es) of {described}; their steps summed:"]
    names = {**STEP_NAMES, "addBatch": FEED_STREAM_ADD_BATCH} if offsets_rows else STEP_NAMES
    lines += [f"  {total[step]:6.2f} s  {names[step]}" for step in STEPS]
    lines.append(f"  {total['triggerExecution']:6.2f} s  the micro-batches (triggerExecution)")
    lines.append(f"  {seconds - total['triggerExecution']:6.2f} s  the rest: query start and stop, the client's wait")
    return lines


def check_rows(spark, path: str, events: int) -> None:
    frame = spark.read.format("delta").load(path)
    rows = frame.count()
    keys = frame.select("partition_id", "position").distinct().count()
    if rows != events or keys != events:
        raise CheckFailed(f"{path}: {rows:,} rows, {keys:,} distinct (partition, position); the feed has {events:,}")


def check_same_rows(spark, first: str, second: str) -> None:
    """The two tables hold the same events (partition, position, payload), row for row."""
    columns = ("partition_id", "position", "payload", "event_id")
    a = spark.read.format("delta").load(first).select(*columns)
    b = spark.read.format("delta").load(second).select(*columns)
    only_a, only_b = a.exceptAll(b).count(), b.exceptAll(a).count()
    if only_a or only_b:
        raise CheckFailed(f"{first} has {only_a} rows {second} has not, which has {only_b} rows the first has not")


def catch_up(spark, feed: FeedSettings, work: Path, args: argparse.Namespace) -> list[list[Load]]:
    """The warm-up round and the counted ones, each a load per mode (in the order they ran)."""
    events = args.partitions * args.events
    modes: list[tuple[str, int | None]] = [(BATCH, None), (STREAM, None)]
    if args.max_events_per_trigger:
        modes.append((STREAM, args.max_events_per_trigger))
    modes += [(FEED_STREAM, None), (JOB_CATCH_UP, None)]
    rounds: list[list[Load]] = []
    for index in range(args.repeat + 1):
        order = modes if index % 2 == 0 else modes[::-1]
        name = "warm-up round (not counted)" if index == 0 else f"round {index}"
        say(f"catch-up, {name}: {' then '.join(mode for mode, _ in order)}; load average {load_average()}")
        loads = []
        for mode, limit in order:
            path = str(work / "catch-up" / f"r{index}-{mode}{limit or ''}")
            if mode == BATCH:
                load = batch_load(spark, feed, path, events)
            elif mode == FEED_STREAM:
                load = feed_stream_available_now(spark, feed, path, events)
            elif mode == JOB_CATCH_UP:
                load = job_catch_up(spark, feed, path, events)
            else:
                load = available_now(spark, feed, path, events, limit)
            check_rows(spark, path, events)
            say(f"  {load.mode}: {load.seconds:.2f} s, {load.rate:,.0f} events/s; {events:,} rows checked")
            loads.append(load)
        if index == args.repeat:  # once: the tables of the last round row for row
            paths = [str(work / "catch-up" / f"r{index}-{mode}{limit or ''}") for mode, limit in modes]
            for other in paths[1:]:
                check_same_rows(spark, paths[0], other)
            say("  the last round's tables hold the same rows (partition, position, payload, event id)")
        elif not args.keep:  # checked: their disk is freed (only the last round's are compared)
            for mode, limit in modes:
                shutil.rmtree(work / "catch-up" / f"r{index}-{mode}{limit or ''}", ignore_errors=True)
                shutil.rmtree(work / "catch-up" / f"r{index}-{mode}{limit or ''}-checkpoint", ignore_errors=True)
        rounds.append(loads)
    return rounds


# ----------------------------------------------------------------------------- latency
@dataclass
class Post:
    """One POST /admin/append: `count` events to `partition`, sent and answered (time.time())."""

    partition: int
    count: int
    sent: float
    answered: float


def publish(admin: str, partitions: int, rate: float, seconds: float, tick: float, stop: threading.Event) -> list[Post]:
    """`rate` events/s for `seconds`: every `tick`, the events due by then, in one POST to the next
    partition in turn (a late tick sends more: the rate holds over the run)."""
    total = round(rate * seconds)
    posts: list[Post] = []
    published = ticks = 0
    started = time.perf_counter()
    with requests.Session() as session:
        while published < total and not stop.is_set():
            due = min(total, int(rate * (time.perf_counter() - started)))
            if due > published:
                partition = len(posts) % partitions
                sent = time.time()
                response = session.post(admin, json={"count": due - published, "partition": partition}, timeout=30)
                answered = time.time()
                response.raise_for_status()
                posts.append(Post(partition, due - published, sent, answered))
                published = due
            ticks += 1
            stop.wait(max(0.0, started + ticks * tick - time.perf_counter()))
    return posts


@dataclass
class Commit:
    version: int
    timestamp: float  # commitInfo.timestamp, seconds since the epoch
    batch: int | None  # the micro-batch (the streaming sink's `txn`; a FeedStream's `txn` is its sink's)
    written: float  # its last data file's modificationTime (its `add` actions), seconds since the epoch
    logged: float  # its `_delta_log` file's mtime: the log entry written
    rows: int  # commitInfo.operationMetrics.numOutputRows


def commits_by_file(table: Path) -> dict[str, Commit]:
    """Each data file of the table: the commit whose `add` action added it."""
    files: dict[str, Commit] = {}
    for log_file in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        txn = next((a["txn"] for a in actions if "txn" in a), None)
        stamp = info.get("inCommitTimestamp", info["timestamp"]) / 1000
        adds = [a["add"] for a in actions if "add" in a]
        written = max((a["modificationTime"] / 1000 for a in adds), default=stamp)
        rows = int(info.get("operationMetrics", {}).get("numOutputRows", 0))
        commit = Commit(
            int(log_file.stem), stamp, txn["version"] if txn else None, written, log_file.stat().st_mtime, rows
        )
        for add in adds:
            files[Path(add["path"]).name] = commit
    return files


def rows_in_log(table: Path) -> int:
    """The rows the table's commits added (Delta's log read as files: no Spark job beside the query)."""
    return sum(commit.rows for commit in {c.version: c for c in commits_by_file(table).values()}.values())


def commits_of_batches(commits: Iterable[Commit], batches: Iterable[dict]) -> dict[int, Commit]:
    """Each micro-batch's commit, by batch id, where the commits do not name their micro-batch (a
    FeedStream's): the one made while it ran, i.e. the last of `batches` started before the commit's
    commitInfo.timestamp, when it had not ended by then (one commit per micro-batch: `MicroBatchCommit`'s)."""
    ordered = sorted(batches, key=lambda b: _epoch(b["timestamp"]))
    starts = [_epoch(b["timestamp"]) for b in ordered]
    found: dict[int, Commit] = {}
    for commit in {c.version: c for c in commits}.values():
        index = bisect.bisect_right(starts, commit.timestamp) - 1
        if index >= 0 and commit.timestamp <= starts[index] + ordered[index]["durationMs"]["triggerExecution"] / 1000:
            found[ordered[index]["batchId"]] = commit
    return found


def events_read(batch: dict, mode: str) -> int:
    """The events a micro-batch read: its input rows, less a FeedStream's row of offsets (`checkpointRows`:
    one per micro-batch; its first micro-batch on an empty feed has that row only)."""
    rows = batch["numInputRows"]
    return rows - 1 if mode == FEED_STREAM and rows else rows


def write_moments(spark, table: Path, commits: dict[str, Commit]) -> dict[int, float]:
    """When each commit's `FeedTable.write` was called, by Delta version: its rows' `loaded_at`, which it
    takes then (a naive UTC datetime, made a TIMESTAMP in the local time zone of the process where
    foreachBatch runs: this machine's, hence `time.timezone`)."""
    from pyspark.sql import functions as F

    rows = (
        spark.read.format("delta")
        .load(str(table))
        .groupBy(F.col("_metadata.file_name").alias("file_name"))
        .agg(F.max(F.unix_micros("loaded_at")).alias("loaded"))
        .collect()
    )
    return {commits[row.file_name].version: row.loaded / 1e6 - time.timezone for row in rows}


def add_batch_parts(batch: dict, commit: Commit, write_called: float) -> list[float]:
    """A FeedStream micro-batch's addBatch cut at its moments (`ADD_BATCH_PARTS`), in seconds. addBatch
    begins after the steps Spark runs before it in a trigger (their durations summed from the trigger's
    start: the untimed moments between them fall in the first part) and lasts its durationMs."""
    durations = batch["durationMs"]
    before = sum(durations.get(step, 0) for step in ("latestOffset", "walCommit", "getBatch", "queryPlanning"))
    begun = _epoch(batch["timestamp"]) + before / 1000
    moments = [
        begun,
        write_called,
        commit.written,
        commit.timestamp,
        commit.logged,
        begun + durations["addBatch"] / 1000,
    ]
    return [later - earlier for earlier, later in itertools.pairwise(moments)]


def _checkpointed(table: Path, version: int) -> bool:
    """Whether Delta wrote a checkpoint of the log at `version` (every 10th commit, by default)."""
    return (table / "_delta_log" / f"{version:020d}.checkpoint.parquet").exists()


def _epoch(timestamp: str) -> float:
    """A progress's `timestamp` (ISO 8601, UTC) in seconds since the epoch."""
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))]


def spread(values: list[float], scale: float = 1000.0, unit: str = "ms") -> str:
    return (
        f"p50 {percentile(values, 0.5) * scale:,.0f} {unit}, p99 {percentile(values, 0.99) * scale:,.0f} {unit}, "
        f"max {max(values) * scale:,.0f} {unit}"
    )


def latency(spark, server_url: str, work: Path, args: argparse.Namespace, mode: str = STREAM) -> list[str]:
    """The latency run of `mode` (STREAM: `stream_to_delta`; FEED_STREAM: `FeedStream`, as the Dagster job
    runs it) on a feed of its own; its report's lines."""
    feed = feed_settings(url=server_url, dialect="published", page_size_hint=args.page_size)
    folder = work / ("latency" if mode == STREAM else f"latency-{mode}")
    table = folder / "table"
    created_table(spark, str(table))
    trigger = f"{args.trigger_ms} milliseconds"
    if mode == STREAM:
        writer = stream_to_delta(stream_reader(spark, feed), str(table), str(folder / "checkpoint"))
        query = writer.trigger(processingTime=trigger).start()
    else:
        stream = FeedStream(
            feed, FeedTable(spark, str(table)), run_id="bench-stream", checkpoint=str(folder / "checkpoint")
        )
        query = stream.start({"processingTime": trigger})
    stop = threading.Event()
    try:
        deadline = time.monotonic() + 120
        while query.lastProgress is None:  # its first trigger ran (an empty feed: no micro-batch)
            if time.monotonic() > deadline or not query.isActive:
                raise CheckFailed(f"the processingTime query made no progress: {query.exception()}")
            time.sleep(0.2)
        admin = server_url.rsplit("/feed", 1)[0] + "/admin/append"
        total = round(args.rate * args.seconds)
        say(
            f"latency, {'stream' if mode == STREAM else FEED_STREAM_MODE}: publishing {args.rate:,.0f} events/s for "
            f"{args.seconds:.0f} s into {args.stream_partitions} partitions, trigger every {args.trigger_ms} ms; "
            f"load average {load_average()}"
        )
        posts: list[Post] = []
        failed: list[BaseException] = []

        def publisher_run() -> None:
            try:
                posts.extend(publish(admin, args.stream_partitions, args.rate, args.seconds, args.tick_ms / 1000, stop))
            except BaseException as error:  # noqa: BLE001 - handed to the main thread
                failed.append(error)

        publisher = threading.Thread(target=publisher_run, name="publisher")
        publisher.start()
        batches: dict[int, dict] = {}
        landed = 0
        deadline = time.monotonic() + args.seconds + 300
        while landed < total or publisher.is_alive():
            if failed:
                raise CheckFailed(f"publishing failed: {failed[0]!r}") from failed[0]
            if not query.isActive:
                raise CheckFailed(f"the processingTime query ended: {query.exception()}")
            if time.monotonic() > deadline:
                raise CheckFailed(f"{landed:,} of {total:,} events in Delta 300 s after the publishing ended")
            time.sleep(1.0)
            for progress in map(progress_of, query.recentProgress):
                batches[progress["batchId"]] = progress
            landed = sum(events_read(b, mode) for b in batches.values())
            if mode != STREAM:  # and the commits' rows (each micro-batch's progress follows its commit)
                landed = min(landed, rows_in_log(table))
        publisher.join()
        say(f"  {landed:,} events in Delta; load average {load_average()}")
        (folder / "progress.json").write_text(json.dumps([batches[k] for k in sorted(batches)], indent=1))
    finally:
        stop.set()
        query.stop()
    return latency_report(spark, server_url, table, posts, batches, args, mode)


def latency_report(
    spark,
    server_url: str,
    table: Path,
    posts: list[Post],
    batches: dict[int, dict],
    args: argparse.Namespace,
    mode: str = STREAM,
) -> list[str]:
    # each partition's events in publication order: their send times
    published: dict[int, list[float]] = {}
    for post in posts:
        published.setdefault(post.partition, []).extend([post.sent] * post.count)
    rows = (
        spark.read.format("delta")
        .load(str(table))
        .select("partition_id", "position", "payload", "_metadata.file_name")
        .collect()
    )
    by_partition: dict[int, list[Any]] = {}
    for row in rows:
        by_partition.setdefault(row.partition_id, []).append(row)
    for partition, sent in published.items():
        stored = sorted(by_partition.pop(partition, []), key=lambda r: r.position)
        feed = requests.get(
            server_url.rsplit("/feed", 1)[0] + "/admin/published", params={"partition": partition}, timeout=60
        ).json()
        if len(feed) != len(sent) or [r.payload for r in stored] != feed:
            raise CheckFailed(
                f"partition {partition}: {len(stored)} rows in Delta, {len(feed)} events published by the server, "
                f"{len(sent)} by this benchmark; or not the same events in the same order"
            )
        if [r.position for r in stored] != list(range(len(stored))):
            raise CheckFailed(f"partition {partition}: positions are not 0..{len(stored) - 1}")
    if by_partition:
        raise CheckFailed(f"rows of partitions nothing was published to: {sorted(by_partition)}")

    commits = commits_by_file(table)
    if mode == STREAM:  # Delta's streaming sink names the micro-batch in its commit (`txn`)
        by_batch = {c.batch: c for c in commits.values() if c.batch is not None}
    else:
        by_batch = commits_of_batches(commits.values(), [b for b in batches.values() if events_read(b, mode)])
    batch_of = {commit.version: batch for batch, commit in by_batch.items()}
    starts = {batch: _epoch(b["timestamp"]) for batch, b in batches.items()}
    waits: list[float] = []  # publication to the start of the micro-batch that read it
    runs: list[float] = []  # that start to the Delta commit
    latencies: list[float] = []
    worst = (0.0, -1)
    for row in rows:
        sent = published[row.partition_id][row.position]
        commit = commits[row.file_name]
        batch = batch_of.get(commit.version)
        latencies.append(commit.timestamp - sent)
        if latencies[-1] > worst[0]:
            worst = (latencies[-1], batch if batch is not None else -1)
        if batch in starts:
            waits.append(starts[batch] - sent)
            runs.append(commit.timestamp - starts[batch])

    first, last = min(p.sent for p in posts), max(p.answered for p in posts)
    events = sum(p.count for p in posts)
    with_rows = sorted((b for b in batches.values() if events_read(b, mode)), key=lambda b: b["batchId"])
    durations = [b["durationMs"]["triggerExecution"] / 1000 for b in with_rows]
    # an event that micro-batch k read was published after micro-batch k-1 read its partition, so
    # after k-1 started: its latency is at most k's start less k-1's, plus k's start to its commit
    # (k-1 with rows too: an idle trigger's progress is not each idle trigger's, Spark reports one in 10 s)
    read = {b["batchId"] for b in with_rows}
    bounds = [
        (starts[b["batchId"]] - starts[b["batchId"] - 1] + by_batch[b["batchId"]].timestamp - starts[b["batchId"]], b)
        for b in with_rows
        if b["batchId"] - 1 in read and b["batchId"] in by_batch
    ]
    bound, bound_batch = max(bounds, key=lambda pair: pair[0]) if bounds else (float("nan"), {"batchId": -1})
    cycle = max(args.trigger_ms / 1000, percentile(durations, 0.5))
    lines = [
        f"published: {events:,} events in {len(posts):,} POSTs over {last - first:.2f} s: {events / (last - first):,.0f} "
        f"events/s (asked: {args.rate:,.0f}); POST round trip {spread([p.answered - p.sent for p in posts])}",
        f"publication (POST sent) to the Delta commit holding the row, {len(latencies):,} events (every one "
        f"checked once, in order, against the server's feed): **{spread(latencies)}**, "
        f"mean {statistics.fmean(latencies) * 1000:,.0f} ms, min {min(latencies) * 1000:,.0f} ms "
        f"(the max in micro-batch {worst[1]})",
        f"  of which waiting for the micro-batch that read it (its trigger's start less the publication; "
        f"negative: published after the start, before the read): {spread(waits)} ({len(waits):,} events)",
        f"  and that micro-batch from its start to its Delta commit: {spread(runs)}",
        f"{len(with_rows)} micro-batches with rows ({percentile([events_read(b, mode) for b in with_rows], 0.5):,.0f} "
        f"rows at the median), trigger every {args.trigger_ms} ms; a micro-batch took {spread(durations)}",
        f"bound: an event read by micro-batch k was published after k-1 started, and k starts at the next "
        f"trigger ({args.trigger_ms:,} ms after k-1 started) or, when k-1 took longer, as k-1 ends: its latency "
        f"is at most max(interval, k-1's duration) + k's start to its commit. Largest here: "
        f"{bound * 1000:,.0f} ms (micro-batch {bound_batch['batchId']}), against the max above. At the median, "
        f"micro-batches start every max(interval, a micro-batch's duration) = {cycle * 1000:,.0f} ms, so "
        f"p50 ~ half of that + a micro-batch's start to its commit = {(cycle / 2 + percentile(runs, 0.5)) * 1000:,.0f} ms",
        "where a micro-batch's time goes (durationMs of query.recentProgress, median / max ms):",
    ]
    names = STEP_NAMES if mode == STREAM else {**STEP_NAMES, "addBatch": FEED_STREAM_ADD_BATCH}
    for step in (*STEPS, "triggerExecution"):
        values = [b["durationMs"].get(step, 0) for b in with_rows]
        name = names.get(step, "the whole micro-batch (triggerExecution)")
        lines.append(f"  {statistics.median(values):8,.0f} / {max(values):8,.0f}  {name}")
    committed = [b for b in with_rows if b["batchId"] in by_batch]
    if mode != STREAM:
        empty = sorted(
            (b for b in batches.values() if b["numInputRows"] and not events_read(b, mode)), key=lambda b: b["batchId"]
        )
        if empty:  # its first, on an empty feed: the offsets moved from none to the partitions' starts
            lines.append(
                "micro-batches of an offsets row and no event (no commit), not counted above: "
                + "; ".join(
                    f"{b['batchId']} ({b['durationMs']['triggerExecution']:,} ms, addBatch {b['durationMs'].get('addBatch', 0):,})"
                    for b in empty
                )
            )
        written = write_moments(spark, table, commits)
        parts = [add_batch_parts(b, by_batch[b["batchId"]], written[by_batch[b["batchId"]].version]) for b in committed]
        lines.append(
            f"of addBatch, {len(parts)} micro-batches with a commit (median / max ms; approx.: the moments of "
            "Delta's log and the rows' loaded_at):"
        )
        for index, name in enumerate(ADD_BATCH_PARTS):
            values = [part[index] * 1000 for part in parts]
            lines.append(f"  {statistics.median(values):8,.0f} / {max(values):8,.0f}  {name}")
    timeline = [
        (
            "the last Parquet file written (its add's modificationTime)",
            [by_batch[b["batchId"]].written for b in committed],
        ),
        ("commitInfo.timestamp (the rows visible)", [by_batch[b["batchId"]].timestamp for b in committed]),
    ]
    lines.append("a micro-batch's timeline from its trigger's start (median / max ms):")
    for name, moments in timeline:
        offsets = [(moment - starts[b["batchId"]]) * 1000 for moment, b in zip(moments, committed, strict=True)]
        lines.append(f"  {statistics.median(offsets):8,.0f} / {max(offsets):8,.0f}  {name}")
    slowest = sorted(committed, key=lambda b: -b["durationMs"]["triggerExecution"])[:3]
    lines.append(
        "slowest micro-batches: "
        + "; ".join(
            f"{b['batchId']} ({b['durationMs']['triggerExecution']:,} ms, addBatch {b['durationMs'].get('addBatch', 0):,}, "
            f"Delta version {by_batch[b['batchId']].version}"
            + (", after which Delta wrote a checkpoint" if _checkpointed(table, by_batch[b["batchId"]].version) else "")
            + ")"
            for b in slowest
        )
    )
    return lines


# ----------------------------------------------------------------------------- report, main
def report(
    rounds: list[list[Load]], args: argparse.Namespace, spark_start: float, latency_lines: dict[str, list[str]]
) -> None:
    events = args.partitions * args.events
    print()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}; {os.cpu_count()} cores, load average {load_average()}; "
        f"Spark Connect server start {spark_start:.1f} s (counted in neither mode)"
    )
    print(
        f"catch-up: {args.partitions} partitions x {args.events:,} events = {events:,}, page size hint "
        f"{args.page_size}, from _first; events/s (seconds), table creation untimed"
    )
    modes = [load.mode for load in rounds[0]]
    for index, loads in enumerate(rounds):
        name = "warm-up" if index == 0 else f"round {index}"
        cells = "; ".join(f"{load.mode} {load.rate:,.0f} ({load.seconds:.2f} s)" for load in loads)
        print(f"  {name:<8} {cells}")
    counted = rounds[1:]
    median = {
        mode: statistics.median(load.rate for loads in counted for load in loads if load.mode == mode) for mode in modes
    }
    batch = next(mode for mode in modes if mode.startswith("batch"))
    for mode in modes:
        ratio = "" if mode == batch else f"; / batch **{median[mode] / median[batch]:.2f}**"
        if mode == FEED_STREAM_MODE:
            ratio += f", / stream availableNow {median[mode] / median['stream availableNow']:.2f}"
        print(f"  median of {len(counted)} counted round(s): {mode} {median[mode]:,.0f} events/s{ratio}")
    print("where the last round's seconds went:")
    for load in rounds[-1]:
        print(f"  {load.mode} ({load.seconds:.2f} s; its table created before, untimed: {load.table_seconds:.2f} s)")
        for line in load.steps:
            print(f"    {line}")
    for mode, lines in latency_lines.items():
        print(
            f"latency{'' if mode == STREAM else ', ' + FEED_STREAM_MODE + ' (after the stream above, its own feed)'}: "
            f"{args.rate:,.0f} events/s for {args.seconds:.0f} s into {args.stream_partitions} partitions, "
            f"processingTime trigger {args.trigger_ms} ms, page size hint {args.page_size}"
        )
        for line in lines:
            print(f"  {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--partitions", type=int, default=16, help="of the catch-up feed")
    parser.add_argument("--events", type=int, help="per partition of the catch-up feed (12,500; --quick: 2,000)")
    parser.add_argument("--page-size", type=int, default=5000, help="the feeds' page size hint")
    parser.add_argument("--repeat", type=int, help="counted catch-up rounds, after a warm-up round (2; --quick: 1)")
    parser.add_argument(
        "--max-events-per-trigger",
        type=int,
        default=None,
        metavar="N",
        help="also the availableNow stream in micro-batches of at most N events (default: a quarter of the "
        "catch-up feed's events; 0: not)",
    )
    parser.add_argument("--rate", type=float, default=1000.0, help="events/s published in the latency run")
    parser.add_argument("--seconds", type=float, help="of publishing in the latency run (60; --quick: 15)")
    parser.add_argument("--trigger-ms", type=int, default=1000, help="the processingTime trigger's interval")
    parser.add_argument("--stream-partitions", type=int, default=4, help="of the latency run's feed")
    parser.add_argument("--tick-ms", type=int, default=10, help="a POST of the events due every ... ms")
    parser.add_argument("--quick", action="store_true", help="smaller defaults: 16 x 2,000 events, 1 round, 15 s")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (tables, checkpoints, logs)")
    args = parser.parse_args(argv)
    for name, full, quick in (("events", 12_500, 2000), ("repeat", 2, 1), ("seconds", 60.0, 15.0)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.max_events_per_trigger is None:
        args.max_events_per_trigger = args.partitions * args.events // 4
    if args.repeat < 1 or args.events < 1 or args.seconds <= 0 or args.trigger_ms < 1 or args.tick_ms < 1:
        parser.error("--repeat, --events, --seconds, --trigger-ms and --tick-ms must be positive")
    # SIGTERM as ctrl-C: the cleanup below runs (the feed servers are in sessions of their own)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    work = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    say(f"work dir {work}; {os.cpu_count()} cores; load average {load_average()}")
    port = find_free_port()
    catch_up_feed = latency_feed = feed_stream_feed = server = None
    try:
        started = time.perf_counter()
        catch_up_feed, url = start_feed_server(
            "feedapi", args.partitions, args.partitions * args.events, work / "feed.log"
        )
        latency_feed, latency_url = start_feed_server("feedapi", args.stream_partitions, 0, work / "latency-feed.log")
        feed_stream_feed, feed_stream_url = start_feed_server(
            "feedapi", args.stream_partitions, 0, work / f"latency-{FEED_STREAM}-feed.log"
        )
        say(
            f"feed servers {url}, {latency_url} and {feed_stream_url}: ready after "
            f"{time.perf_counter() - started:.1f} s"
        )

        say(f"starting the Spark Connect server on port {port}; load average {load_average()}")
        settings = SparkSettings(mode="embedded", port=port, work_dir=work / "spark")
        started = time.perf_counter()
        server = ensure_embedded_server(port, conf=settings.conf, work_dir=settings.work_dir)
        spark_start = time.perf_counter() - started
        say(f"  ready after {spark_start:.1f} s (pid {server.pid})")
        spark = spark_session(settings)
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", PROGRESS_KEPT)
        register_feed_source(spark)

        feed = feed_settings(url=url, dialect="published", page_size_hint=args.page_size)
        rounds = catch_up(spark, feed, work, args)
        latency_lines = {
            STREAM: latency(spark, latency_url, work, args),
            FEED_STREAM: latency(spark, feed_stream_url, work, args, FEED_STREAM),
        }
    except Exception:  # noqa: BLE001 - reported, exit 1
        traceback.print_exc()
        return 1
    finally:
        stop_process(catch_up_feed)
        stop_process(latency_feed)
        stop_process(feed_stream_feed)
        if server is not None:
            server.stop()
        if strays := release_spark_port(port):
            say(f"stopped a Spark server left on port {port}: {strays}")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report(rounds, args, spark_start, latency_lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
