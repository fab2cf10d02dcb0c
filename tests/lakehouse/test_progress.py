"""A load's progress shows in its log while Spark still reads: each partition's figures as soon as
its read task is done."""
import logging
import threading

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.demo.server import Gate
from feedapi_dagster.lakehouse.progress import ReadNotes
from feedapi_dagster.lakehouse.reads import GroupRead, ReadEnd, ReadSettings


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_each_partitions_read_is_logged_when_its_task_ends_not_when_the_job_does(spark, make_loader):
    logger = logging.getLogger("test_progress")
    lines = Lines()
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    feed = DemoFeed(partitions=2, events=120, seed=5)
    with DemoFeedServer(feed, dialect="published") as server:
        loader = make_loader(server, page_size_hint=25)
        loader.log = logger
        gate = server.gate = Gate(partition=1)  # partition 1's read waits; partition 0's goes through
        reports = {}
        load = threading.Thread(target=lambda: reports.update(loader.sync()))
        load.start()
        try:
            assert gate.arrived.wait(120), "partition 1 was never fetched"
            deadline = threading.Event()
            for _ in range(600):
                if any(line.startswith("partition 0: read") for line in lines.lines):
                    break
                deadline.wait(0.1)
            assert load.is_alive(), "the load ended while partition 1 was held"
            live = [line for line in lines.lines if line.startswith("partition 0: read")]
            assert live and "1 of 2 read tasks done" in live[0], lines.lines
        finally:
            server.gate = None
            gate.opened.set()
            load.join(120)
    for partition in (0, 1):
        (line,) = [line for line in lines.lines if line.startswith(f"partition {partition}: read")]
        assert f"read {reports[partition].events} events in {reports[partition].pages} pages" in line
        assert "events/s" in line


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
            ends = [ReadEnd(events=task, pages=1, duplicates=0, drained=True),
                    ReadEnd(events=1, pages=1, duplicates=0, drained=False)]
            GroupRead(ReadSettings("id", True, None, 1, str(tmp_path / "notes")), None, None, [])._note(
                [(task, ends[0]), (tasks + task, ends[1])])
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
