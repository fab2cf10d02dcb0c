"""A load's progress shows in its log while Spark still reads: each partition's figures as soon as
its read task is done."""
import logging
import os
import threading

import pyarrow as pa
import pyarrow.parquet as pq

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.demo.server import Gate
from feedapi_dagster.lakehouse.datasource import ReadEnd
from feedapi_dagster.lakehouse.progress import StagedReads


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
            assert live and "1 of 2 partitions read" in live[0], lines.lines
        finally:
            server.gate = None
            gate.opened.set()
            load.join(120)
    for partition in (0, 1):
        (line,) = [line for line in lines.lines if line.startswith(f"partition {partition}: read")]
        assert f"read {reports[partition].events} events in {reports[partition].pages} pages" in line
        assert "events/s" in line


def test_staged_reads_follow_spark_moving_and_deleting_task_folders_and_report_each_read_once(tmp_path):
    """Spark's file commit protocol renames task folders and deletes them while the run lists the
    staging folder (a cluster test once failed on a folder that vanished under `rglob`)."""
    tasks = 300
    watcher = StagedReads(str(tmp_path))
    reported: list[int] = []
    done = threading.Event()

    def spark_commits():
        for task in range(tasks):
            attempt = tmp_path / "_temporary" / "0" / "_temporary" / f"attempt_{task}"
            attempt.mkdir(parents=True)
            name = f"part-{task:05d}.parquet"
            end = ReadEnd(events=task, pages=1, duplicates=0, drained=True).to_json()
            pq.write_table(pa.table({"partition_id": [task], "read_end": [end]}), attempt / name)
            committed = tmp_path / "_temporary" / "0" / f"task_{task}"
            os.rename(attempt, committed)  # task commit
            os.rename(committed / name, tmp_path / name)  # job commit
            committed.rmdir()
        done.set()

    writer = threading.Thread(target=spark_commits)
    writer.start()
    try:
        while not done.is_set():
            reported.extend(pid for pid, _ in watcher.new_reads())
    finally:
        writer.join()
    reported.extend(pid for pid, _ in watcher.new_reads())
    assert sorted(reported) == list(range(tasks))
