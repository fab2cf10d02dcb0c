"""What a read task of the `feedapi` data source does: its feed partitions, read concurrently, as
Arrow record batches.

A task holds a group of feed partitions (`planning.task_groups`). Each is read by a `PartitionRead`
(pages from its start cursor, in batches of about `GROUP_EVENTS` events); a group of several is read
by a few threads at once, each with its own HTTP session, and their batches are handed to Spark as
they come: the HTTP waits of small partitions overlap, so a task of a hundred small partitions costs
little more than one of a single partition. Each partition's last row is its checkpoint row when
asked for (`checkpointRows`): where that read stopped.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from feedapi_dagster.protocol import FeedClient, FeedInfo, PageRun, ProtocolError, RediscoveryNeeded
from feedapi_dagster.read.rows import EVENT_SCHEMA, EventBatch, event_ids

# The column of a partition's checkpoint row (`checkpointRows`): JSON of `ReadEnd`; NULL on event rows.
END_COLUMN = "read_end"
# Events (or payload bytes) per Arrow batch a task hands Spark.
GROUP_EVENTS = 10_000
GROUP_BYTES = 8 * 1024 * 1024
_MAX_REDISCOVERIES = 3
_REPEATS_SHOWN = 5
_DONE = object()


@dataclass(frozen=True)
class ReadEnd:
    """Where a task stopped reading one partition: the checkpoint row's `read_end`, with the row's
    `position` (the next event's) and `cursor` (the resume point)."""

    events: int
    pages: int
    duplicates: int
    drained: bool  # closed (or a `_done` checkpoint) and read to its end
    bounded: bool = False  # stopped at `maxEvents`: there may be more
    error: str | None = None
    seconds: float = 0.0  # the partition's own read: wall time from its first request to its checkpoint row
    # ids an exactly-once feed sent more than once in this read (their count, and a few of them): the
    # `no_duplicate_event_ids` check of the rows a load adds, answered without scanning them
    repeated_ids: int = 0
    repeated_examples: tuple[str, ...] = ()
    # the page cursor of the last event read (None: none read): where the read stopped too, unless
    # pages without events moved the cursor on; then the rows alone cannot say where it stopped
    last_row_cursor: str | None = None

    def to_json(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ReadEnd:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, fields: dict) -> ReadEnd:
        return cls(**{**fields, "repeated_examples": tuple(fields.get("repeated_examples", ()))})


@dataclass(frozen=True)
class PartitionStart:
    partition_id: int
    cursor: str
    position: int


@dataclass(frozen=True)
class ReadSettings:
    """What every read of one data source query shares (`FeedSourceOptions` makes it)."""

    event_id_field: str
    checkpoint_rows: bool
    max_events: int | None  # a bound per partition: it stops at the first checkpoint at or past it
    threads: int  # partitions read at once by a task
    progress_folder: str | None  # where a task notes what it read when it ends (the run's log shows it)


class GroupRead:
    """One task: its feed partitions, `settings.threads` at a time, with the discovery planned for it."""

    def __init__(self, settings: ReadSettings, make_client, info: FeedInfo, starts: list[PartitionStart]):
        self.settings = settings
        self.make_client = make_client  # (FeedInfo) -> FeedClient: one per thread, requests is not thread-safe
        self.info = info
        self.starts = starts
        self.ends: list[tuple[int, ReadEnd]] = []

    def batches(self) -> Iterator[pa.RecordBatch]:
        if len(self.starts) <= 1 or self.settings.threads <= 1:
            with self.make_client(self.info) as client:
                for start in self.starts:
                    yield from self._read(client, start)
        else:
            yield from self._concurrently()
        self._note(self.ends)

    def _read(self, client: FeedClient, start: PartitionStart) -> Iterator[pa.RecordBatch]:
        read = PartitionRead(self.settings, client, start)
        yield from read.batches()
        if read.end is not None:
            self.ends.append((start.partition_id, read.end))

    def _concurrently(self) -> Iterator[pa.RecordBatch]:
        todo: queue.SimpleQueue[PartitionStart] = queue.SimpleQueue()
        for start in self.starts:
            todo.put(start)
        threads = min(self.settings.threads, len(self.starts))
        out: queue.Queue = queue.Queue(maxsize=2 * threads)  # a few batches in flight: memory stays bounded
        stop = threading.Event()

        def worker() -> None:
            try:
                with self.make_client(self.info) as client:
                    while not stop.is_set():
                        try:
                            start = todo.get_nowait()
                        except queue.Empty:
                            return
                        for batch in self._read(client, start):
                            out.put(batch)
            except BaseException as error:  # noqa: BLE001 - handed to the task's thread, which raises it
                out.put(error)
            finally:
                out.put(_DONE)

        with ThreadPoolExecutor(threads, thread_name_prefix="feedapi-read") as pool:
            for _ in range(threads):
                pool.submit(worker)
            running = threads
            try:
                while running:
                    item = out.get()
                    if item is _DONE:
                        running -= 1
                    elif isinstance(item, BaseException):
                        raise item
                    else:
                        yield item
            finally:  # the task failed or was cancelled: the readers stop at their next partition
                stop.set()
                while running:
                    running -= out.get() is _DONE

    def _note(self, ends: list[tuple[int, ReadEnd]]) -> None:
        """Best effort: the run lists these notes while Spark still reads (`progress.py`)."""
        folder = self.settings.progress_folder
        if not folder or not ends:
            return
        try:
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"{uuid.uuid4().hex}.json")
            with open(path + ".tmp", "w") as note:
                json.dump([[pid, end.__dict__] for pid, end in ends], note)
            os.replace(path + ".tmp", path)
        except OSError:
            pass


class PartitionRead:
    """The pages of one partition from its start cursor, as Arrow record batches."""

    def __init__(self, settings: ReadSettings, client: FeedClient, start: PartitionStart):
        self.settings = settings
        self.client = client
        self.partition_id = start.partition_id
        self.cursor = start.cursor
        self.position = start.position
        self.events = self.pages = self.duplicates = 0
        self._fetched = 0  # events fetched, duplicates included (what `maxEvents` bounds)
        self.done = False
        self.last_row_cursor: str | None = None
        self.end: ReadEnd | None = None
        # Ids seen in this read. An at-least-once feed repeats events: they are dropped (ids stored by
        # earlier loads are the loader's business, in Spark). An exactly-once feed must not: they are
        # kept (the feed's rows as sent) and counted, for the load's duplicate-id check.
        self._exactly_once = client.info.exactly_once
        self._seen: set = set()
        self.repeated_ids = 0
        self._repeated_examples: list[str] = []

    def batches(self) -> Iterator[pa.RecordBatch]:
        settings = self.settings
        schema = read_schema(settings.checkpoint_rows)
        started = time.monotonic()
        partition = self.client.info.partition(self.partition_id)
        closed = partition is not None and partition.closed
        error = None
        try:
            for runs in self._run_groups():
                yield self._batch(runs, schema)
        except ProtocolError as failure:
            if not settings.checkpoint_rows:
                raise
            error = str(failure)
        if settings.checkpoint_rows:
            drained = error is None and (self.done or (closed and not self._bounded))
            self.end = ReadEnd(
                self.events,
                self.pages,
                self.duplicates,
                drained,
                self._bounded and not drained,
                error,
                round(time.monotonic() - started, 3),
                self.repeated_ids,
                tuple(self._repeated_examples),
                self.last_row_cursor,
            )
            yield pa.RecordBatch.from_pydict(
                {
                    "partition_id": [self.partition_id],
                    "position": [self.position],
                    "cursor": [self.cursor],
                    "payload": [None],
                    "payload_type": [None],
                    "event_id": [None],
                    END_COLUMN: [self.end.to_json()],
                },
                schema=schema,
            )

    @property
    def _bounded(self) -> bool:
        return self.settings.max_events is not None and self._fetched >= self.settings.max_events

    def _run_groups(self) -> Iterator[list[PageRun]]:
        """Page runs in groups of about `GROUP_EVENTS` events or `GROUP_BYTES` bytes; what was read
        before an error is yielded before the error is raised (it is good: it gets committed)."""
        runs: list[PageRun] = []
        count = size = 0
        try:
            for run in self._runs():
                runs.append(run)
                count += len(run.raw_events)
                self._fetched += len(run.raw_events)
                size += run.payload_bytes
                if count >= GROUP_EVENTS or size >= GROUP_BYTES:
                    yield runs
                    runs, count, size = [], 0, 0
                if self._bounded:
                    break
        except Exception:
            if runs:
                yield runs
            raise
        if runs:
            yield runs

    def _runs(self) -> Iterator[PageRun]:
        cursor = self.cursor  # of the last run read (runs are batched later: `self.cursor` lags)
        for attempt in range(1, _MAX_REDISCOVERIES + 2):
            try:
                for run in self.client.page_runs(self.partition_id, cursor):
                    yield run
                    cursor = run.cursor
                return
            except RediscoveryNeeded:
                # the discovery token changed (published dialect): discover again and go on from the
                # last cursor, unless the partition vanished in a method-2 split
                if attempt > _MAX_REDISCOVERIES:
                    raise
                if self.client.discover().partition(self.partition_id) is None:
                    return

    def _batch(self, runs: list[PageRun], schema: pa.Schema) -> pa.RecordBatch:
        batch = EventBatch(self.settings.event_id_field)
        for run in runs:
            raws, ends = run.raw_events, run.ends
            if not self._exactly_once:
                raws, ends = _unseen(raws, ends, event_ids(raws, self.settings.event_id_field), self._seen)
                self.duplicates += len(run.raw_events) - len(raws)
            batch.add(run.partition_id, self.position, raws, ends, run.cursors)
            self.position += len(raws)
            self.events += len(raws)
            self.pages += len(run.ends)
            self.cursor = run.cursor
            self.done = self.done or run.done
        rows = batch.to_arrow()
        if rows.num_rows:
            self.last_row_cursor = rows.column("cursor")[-1].as_py()
        if self._exactly_once:
            self._count_repeats(rows.column("event_id").to_pylist())
        if END_COLUMN in schema.names:
            rows = rows.append_column(END_COLUMN, pa.nulls(rows.num_rows, pa.string()))
        return rows.combine_chunks().to_batches()[0] if rows.num_rows else pa.RecordBatch.from_pylist([], schema)

    def _count_repeats(self, ids: list[str | None]) -> None:
        seen = self._seen
        for event_id in ids:
            if event_id is None:
                continue
            if event_id in seen:
                self.repeated_ids += 1
                if len(self._repeated_examples) < _REPEATS_SHOWN:
                    self._repeated_examples.append(event_id)
            else:
                seen.add(event_id)


def read_schema(checkpoint_rows: bool) -> pa.Schema:
    return EVENT_SCHEMA.append(pa.field(END_COLUMN, pa.string())) if checkpoint_rows else EVENT_SCHEMA


def _unseen(
    raws: list[bytes], ends: list[int], ids: list[bytes | None], seen: set[bytes]
) -> tuple[list[bytes], list[int]]:
    """The events whose id was not seen (adding theirs), and the pages' new ends."""
    kept: list[bytes] = []
    kept_ends: list[int] = []
    start = 0
    for end in ends:
        for raw, event_id in zip(raws[start:end], ids[start:end], strict=True):
            if event_id is not None:
                if event_id in seen:
                    continue
                seen.add(event_id)
            kept.append(raw)
        kept_ends.append(len(kept))
        start = end
    return kept, kept_ends
