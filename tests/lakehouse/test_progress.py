"""A load's progress shows in its log while Spark still reads: each partition's figures as soon as
its read task is done. The figures are true: times are the job's wall time (no per-partition rate),
a read that Spark kept is timed from its start, and a sync with nothing new says so, not that it
committed."""

import logging
import re
import threading
import time

from feedapi_dagster.demo import DemoFeed, DemoFeedServer, Gate
from feedapi_dagster.read.progress import ReadNotes
from feedapi_dagster.read.read_tasks import GroupRead, ReadEnd, ReadSettings


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _logger(name: str) -> tuple[logging.Logger, Lines]:
    logger = logging.getLogger(name)
    lines = Lines()
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    return logger, lines


def _seconds(line: str, pattern: str) -> float:
    return float(re.search(pattern, line).group(1))


def test_each_partitions_read_is_logged_when_its_task_ends_not_when_the_job_does(spark, make_loader):
    logger, lines = _logger("test_progress")
    feed = DemoFeed(partitions=2, events=120, seed=5)
    with DemoFeedServer(feed, dialect="published") as server:
        loader = make_loader(server, page_size_hint=25)
        loader.log = logger
        gate = server.gate = Gate(partition=1)  # partition 1's read waits; partition 0's goes through
        reports = {}
        held_since = None
        load = threading.Thread(target=lambda: reports.update(loader.sync()))
        load.start()
        try:
            assert gate.arrived.wait(120), "partition 1 was never fetched"
            held_since = time.monotonic()  # the Spark job is reading: partition 1's task waits from here
            deadline = threading.Event()
            for _ in range(600):
                if any(line.startswith("partition 0: read") for line in lines.lines):
                    break
                deadline.wait(0.1)
            assert load.is_alive(), "the load ended while partition 1 was held"
            live = [line for line in lines.lines if line.startswith("partition 0: read")]
            assert live and "1 of 2 read tasks done" in live[0], lines.lines
            deadline.wait(2.0)  # partition 1's task is held for at least this long
        finally:
            server.gate = None
            gate.opened.set()
            held = time.monotonic() - held_since if held_since is not None else 0.0
            load.join(120)
    for partition in (0, 1):
        (line,) = [line for line in lines.lines if line.startswith(f"partition {partition}: read")]
        assert f"read {reports[partition].events} events in {reports[partition].pages} pages" in line
        assert "events/s" not in line  # a task's own rate said nothing true of the load
    # the time a task's line gives is the job's: partition 1's task ended after it was held
    (last,) = [line for line in lines.lines if line.startswith("partition 1: read")]
    assert "2 of 2 read tasks done" in last
    assert _seconds(last, r"done ([\d.]+) s into the Spark job") >= held
    for report in reports.values():  # a partition's own read is part of the load that read it
        assert 0 < report.read_seconds <= report.load_seconds
    (summary,) = [line for line in lines.lines if "from 2 partitions read and written by Spark" in line]
    assert _seconds(summary, r" in ([\d.]+) s \(") >= held


def test_a_sync_with_nothing_new_says_so_and_claims_no_commit(spark, make_loader):
    feed = DemoFeed(partitions=2, events=80, seed=6)
    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server).sync()
        logger, lines = _logger("test_progress_quiet")
        loader = make_loader(server)
        loader.log = logger
        reports = loader.sync()
    assert all(report.events == 0 and report.delta_version is None for report in reports.values())
    (quiet,) = [line for line in lines.lines if "nothing new" in line]
    assert quiet.startswith("partitions [0, 1]: nothing new (Spark's read took "), quiet
    assert "holds no rows" in quiet
    assert not [line for line in lines.lines if "committed" in line], lines.lines


def test_a_kept_read_is_timed_from_its_start(spark, make_loader):
    """An at-least-once feed's second sync is deduplicated against the table: Spark reads and keeps
    the read first; the load's figures count that read's time (they counted from after it)."""
    feed = DemoFeed(partitions=2, events=150, seed=8, exactly_once=False, duplicate_ratio=0.1)
    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server).sync()
        feed.append(90)
        logger, lines = _logger("test_progress_kept")
        loader = make_loader(server)
        loader.log = logger
        reports = loader.sync()
    assert sum(report.events for report in reports.values()) > 0
    (kept,) = [line for line in lines.lines if line.startswith("partitions [0, 1]: read and kept by Spark in")]
    (summary,) = [line for line in lines.lines if "from 2 partitions read and kept by Spark in" in line]
    assert _seconds(summary, r" in ([\d.]+) s \(") >= _seconds(kept, r" in ([\d.]+) s$")
    for report in reports.values():
        assert report.load_seconds >= _seconds(kept, r" in ([\d.]+) s$") - 0.05  # the line's is rounded


def test_read_notes_are_reported_once_each_while_tasks_keep_writing_them(tmp_path):
    """Read tasks write their notes while the run lists the folder: a note is seen whole or not at
    all (written aside, then renamed), and each once."""
    tasks = 300
    notes = ReadNotes(str(tmp_path / "notes"))
    assert notes.new() == []  # no task done yet: no folder
    reported: list[int] = []
    done = threading.Event()

    def tasks_finish():
        for task in range(tasks):
            ends = [
                ReadEnd(events=task, pages=1, duplicates=0, drained=True),
                ReadEnd(events=1, pages=1, duplicates=0, drained=False),
            ]
            GroupRead(ReadSettings("id", True, None, 1, str(tmp_path / "notes")), None, None, [])._note(
                [(task, ends[0]), (tasks + task, ends[1])]
            )
        done.set()

    writer = threading.Thread(target=tasks_finish)
    writer.start()
    try:
        while not done.is_set():
            reported.extend(pid for reads in notes.new() for pid, _ in reads)
    finally:
        writer.join()
    reported.extend(pid for reads in notes.new() for pid, _ in reads)
    assert sorted(reported) == list(range(2 * tasks))
