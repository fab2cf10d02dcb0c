"""Progress of a load while Spark reads it: what each finished read task read, as it finishes.

A read task ends by noting each of its partitions' figures (events, pages) in a small file of the
load's progress folder (`reads.GroupRead`). Where the run can list that folder (a local or mounted
lakehouse, the embedded server), the run's log shows each task's figures as soon as it is done, with
the time since the Spark job started, and a heartbeat for the ones still reading. Elsewhere the
heartbeat alone. No rate per task: a task's own reading time is a small part of the job's (Spark's
scheduling, its Python workers, the write), and its events/s said nothing true of the load. The notes
are for people: what is committed comes from the read's own checkpoint rows.

The heartbeat (every 10 s) is also the load's sign of life: every phase of a load that may last
minutes (the read, the Delta write, the checks' scans, OPTIMIZE and VACUUM) runs under one, so a load
whose run log stays silent for minutes is one whose process is gone (Dagster's orchestration fails it:
the feed's stalled-load sensor).
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

from .reads import ReadEnd

T = TypeVar("T")
HEARTBEAT_SECONDS = 10.0


def run_with_progress(
    job: Callable[[], T],
    folder: str | None,
    tasks: int,
    logger: logging.Logger | logging.LoggerAdapter,
    poll_seconds: float = 1.0,
) -> T:
    """Run `job` (the Spark job that reads the feed) with each read task's figures in the log as the
    task ends, and a heartbeat for the others (`run_with_heartbeat`)."""
    notes = ReadNotes(folder)

    def new_notes(seconds: float) -> None:
        for reads in notes.new():
            _log_task(logger, reads, len(notes.seen), tasks, seconds)

    def beat(seconds: float) -> None:
        logger.info("Spark is reading: %d of %d read tasks done after %.0f s", len(notes.seen), tasks, seconds)

    return run_with_heartbeat(job, beat, new_notes, poll_seconds)


def run_with_heartbeat(
    job: Callable[[], T],
    beat: Callable[[float], None],
    poll: Callable[[float], None] = lambda seconds: None,
    poll_seconds: float = 1.0,
) -> T:
    """Run `job` in a thread and, from this thread (a Dagster log manager writes to the instance from
    the thread that owns it), `poll` every `poll_seconds` and `beat` every `HEARTBEAT_SECONDS` until
    it ends (each with the seconds since it started). The beats are the run's sign of life: a load
    whose log stays silent for `schedule.stalled_load_seconds` is taken for dead."""
    started = last_beat = time.monotonic()
    with ThreadPoolExecutor(1, thread_name_prefix="feedapi-job") as pool:
        future: Future[T] = pool.submit(job)
        while True:
            finished = _wait(future, poll_seconds)
            poll(time.monotonic() - started)
            if finished:
                return future.result()
            now = time.monotonic()
            if now - last_beat >= HEARTBEAT_SECONDS:
                last_beat = now
                beat(now - started)


def logged_heartbeat(job: Callable[[], T], logger: logging.Logger | logging.LoggerAdapter, doing: str) -> T:
    """`job` with "<doing>: still at it after N s" in the log every `HEARTBEAT_SECONDS`: a phase of a
    load that may last minutes (a large Delta write, the checks' scans, OPTIMIZE) without other lines."""
    return run_with_heartbeat(job, lambda seconds: logger.info("%s: still at it after %.0f s", doing, seconds))


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
