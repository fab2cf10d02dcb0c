"""Progress of a load while Spark reads it: what each finished read task staged, as it finishes.

A read task ends its output with a checkpoint row (`read_end`: events, pages, its reading time), and
Spark's file commit protocol moves a task's files out of its attempt folder when the task succeeds.
Where the run can list the staging folder (a local or mounted lakehouse), those rows are readable
while the job still runs, so the run's log shows each partition's figures as soon as its task is
done, and a heartbeat for the ones still reading. Elsewhere the heartbeat alone.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from .datasource import END_COLUMN, ReadEnd
from .delta import local_path

T = TypeVar("T")
HEARTBEAT_SECONDS = 10.0


def run_with_progress(job: Callable[[], T], staging: str, partitions: int,
                      logger: "logging.Logger | logging.LoggerAdapter", poll_seconds: float = 1.0) -> T:
    """Run `job` (the Spark job that stages the read) in a thread; log from this thread (a Dagster
    log manager writes to the instance from the thread that owns it) until it ends."""
    watcher = StagedReads(staging)
    started = last_beat = time.monotonic()
    with ThreadPoolExecutor(1, thread_name_prefix="feedapi-stage") as pool:
        future: Future[T] = pool.submit(job)
        while True:
            finished = _wait(future, poll_seconds)
            for partition_id, read in watcher.new_reads():
                logger.info("partition %s: read %d events in %d pages in %.1f s (%.0f events/s); %d of %d "
                            "partitions read", partition_id, read.events, read.pages, read.seconds,
                            read.events / max(read.seconds, 1e-3), len(watcher.seen), partitions)
            if finished:
                return future.result()
            now = time.monotonic()
            if now - last_beat >= HEARTBEAT_SECONDS:
                last_beat = now
                logger.info("Spark is reading: %d of %d partitions read after %.0f s", len(watcher.seen), partitions,
                            now - started)


def _wait(future: Future, seconds: float) -> bool:
    try:
        future.exception(timeout=seconds)
    except TimeoutError:
        return False
    return True


class StagedReads:
    """The checkpoint rows of the read tasks Spark has committed so far under `staging`."""

    def __init__(self, staging: str):
        self.root = Path(local_path(staging)) if local_path(staging) else None
        self.seen: dict[str, None] = {}

    def new_reads(self) -> list[tuple[int, ReadEnd]]:
        if self.root is None:
            return []
        reads = []
        # os.walk, not Path.rglob: Spark's commit protocol renames and deletes task folders while they are
        # listed, and os.walk passes over a folder that vanished where rglob raises FileNotFoundError
        for folder, subfolders, files in os.walk(self.root):
            # an attempt folder's files are not committed yet: that attempt may still fail
            subfolders[:] = [name for name in subfolders if not name.startswith("attempt_")]
            for name in files:  # unique per task output; the job's commit moves it to another folder
                if not name.endswith(".parquet") or name in self.seen:
                    continue
                try:
                    reads.extend(_read_ends(Path(folder, name)))
                except (OSError, ValueError):  # moved by the job's commit while listed: seen in the final folder
                    continue
                self.seen[name] = None
        return reads


def _read_ends(path: Path) -> list[tuple[int, ReadEnd]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["partition_id", END_COLUMN])
    return [(pid, ReadEnd.from_json(end)) for pid, end in zip(table.column(0).to_pylist(), table.column(1).to_pylist())
            if end is not None]
