"""Progress of a load while Spark reads it: what each finished read task read, as it finishes.

A read task ends by noting each of its partitions' figures (events, pages) in a small file of the
load's progress folder (`read_tasks.GroupRead`). Where the run can list that folder (a local or mounted
lakehouse, the embedded server), the run's log shows each task's figures as soon as it is done, with
the time since the Spark job started, and a heartbeat for the ones still reading. Elsewhere the
heartbeat alone. No rate per task: a task's own reading time is a small part of the job's (Spark's
scheduling, its Python workers, the write), and its events/s said nothing true of the load. The notes
are for people: what is committed comes from the read's own checkpoint rows.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from feedapi_dagster.read.read_tasks import ReadEnd

T = TypeVar("T")
HEARTBEAT_SECONDS = 10.0


def run_with_progress(
    job: Callable[[], T],
    folder: str | None,
    tasks: int,
    logger: logging.Logger | logging.LoggerAdapter,
    poll_seconds: float = 1.0,
) -> T:
    """Run `job` (the Spark job that reads the feed) in a thread; log from this thread (a Dagster
    log manager writes to the instance from the thread that owns it) until it ends."""
    notes = ReadNotes(folder)
    started = last_beat = time.monotonic()
    with ThreadPoolExecutor(1, thread_name_prefix="feedapi-read") as pool:
        future: Future[T] = pool.submit(job)
        while True:
            finished = _wait(future, poll_seconds)
            for reads in notes.new():
                _log_task(logger, reads, len(notes.seen), tasks, time.monotonic() - started)
            if finished:
                return future.result()
            now = time.monotonic()
            if now - last_beat >= HEARTBEAT_SECONDS:
                last_beat = now
                logger.info(
                    "Spark is reading: %d of %d read tasks done after %.0f s", len(notes.seen), tasks, now - started
                )


def _log_task(
    logger: logging.Logger | logging.LoggerAdapter,
    reads: list[tuple[int, ReadEnd]],
    done: int,
    tasks: int,
    seconds: float,
) -> None:
    """`seconds`: since the Spark job started."""
    events = sum(end.events for _, end in reads)
    pages = sum(end.pages for _, end in reads)
    which = f"partition {reads[0][0]}" if len(reads) == 1 else f"{len(reads)} partitions"
    logger.info(
        "%s: read %d events in %d pages; %d of %d read tasks done %.1f s into the Spark job",
        which,
        events,
        pages,
        done,
        tasks,
        seconds,
    )


def _wait(future: Future, seconds: float) -> bool:
    try:
        future.exception(timeout=seconds)
    except TimeoutError:
        return False
    return True


class ReadNotes:
    """The notes the read tasks have left in `folder` so far (a task attempt's note appears whole:
    written aside, then renamed)."""

    def __init__(self, folder: str | None):
        self.root = Path(folder) if folder else None
        self.seen: dict[str, None] = {}

    def new(self) -> list[list[tuple[int, ReadEnd]]]:
        if self.root is None:
            return []
        try:
            names = sorted(name for name in os.listdir(self.root) if name.endswith(".json") and name not in self.seen)
        except FileNotFoundError:  # no task has finished yet
            return []
        found = []
        for name in names:
            try:
                entries = json.loads((self.root / name).read_text())
            except (OSError, ValueError):
                continue
            self.seen[name] = None
            found.append([(int(pid), ReadEnd.from_dict(end)) for pid, end in entries])
        return found
