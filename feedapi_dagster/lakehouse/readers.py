"""Partition readers: fetch a partition's pages and turn them into rows, off the writer's thread.

A `PartitionReader` owns one partition for one load: it pages from the plan's cursor, numbers the
events from the committed position, drops events whose id was seen (at-least-once feeds), derives the
columns and hands the writer `RowGroup`s: Arrow rows plus the cursor that covers them. The writer
only appends groups and commits; every cursor it commits comes from a group it holds.

Readers run as threads of the load process (`read_processes: 0`, the default) or in reader
processes. The per-event work is in Rust (`feedapi_native`), so what a reader does under the GIL is
per response body and per group; processes only help a feed whose filters decode events in Python.
Rows cross the process boundary as Arrow (pickled as Arrow IPC, one copy).
"""
from __future__ import annotations

import contextlib
import logging
import multiprocessing
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

import pyarrow as pa

from feedapi_dagster.planning import PartitionPlan
from feedapi_dagster.protocol import FeedClient, PageRun, RediscoveryNeeded

from .table import EventBatch, event_ids

log = logging.getLogger(__name__)

_MAX_REDISCOVERIES = 3
# Feeds checkpoint every few events: a hand-off per page would cost more than the events themselves,
# and each group's hand-off and columns cost the GIL a round trip (measured: 2,000 events per group
# loaded 1M events ~25% slower than 10,000). The byte bound keeps large events from piling up.
GROUP_EVENTS = 10_000
GROUP_BYTES = 8 * 1024 * 1024


@dataclass
class RowGroup:
    """Consecutive pages of one partition as rows (`table.EVENT_SCHEMA`), and where they end."""

    partition_id: int
    rows: pa.Table
    cursor: str
    position: int  # the position after these rows
    pages: int
    duplicates: int
    size: int  # payload bytes


# Messages from readers to the writer: ("group", partition, RowGroup), ("error", partition, text),
# ("end", partition, finished by a `_done` checkpoint).
Message = tuple[str, int, object]
Emit = Callable[[Message], bool]  # False: the load stopped, the reader gives up


@dataclass
class PartitionReader:
    client: FeedClient
    plan: PartitionPlan
    position: int  # where the partition's committed rows end
    event_id_field: str
    seen_ids: set[bytes] | None  # ids already stored (at-least-once feeds); None: no deduplication

    def run(self, emit: Emit, discovery_lock: threading.Lock) -> None:
        partition_id = self.plan.partition_id
        done = False
        try:
            for runs in self._run_lists(discovery_lock):
                group = self._rows(runs)
                done = done or runs[-1].done
                if not emit(("group", partition_id, group)):
                    return
        except Exception as error:  # noqa: BLE001 - reported per partition; the others go on
            log.error("partition %s: %s", partition_id, error)
            emit(("error", partition_id, str(error)))
            return
        emit(("end", partition_id, done))

    def _run_lists(self, discovery_lock: threading.Lock) -> Iterator[list[PageRun]]:
        """The partition's page runs in lists of about `GROUP_EVENTS` events or `GROUP_BYTES` bytes; what
        was read before an error is yielded before the error is raised (it is good: it gets committed)."""
        runs: list[PageRun] = []
        count = size = 0
        try:
            for run in self._runs(discovery_lock):
                runs.append(run)
                count += len(run.raw_events)
                size += run.payload_bytes
                if count >= GROUP_EVENTS or size >= GROUP_BYTES:
                    yield runs
                    runs, count, size = [], 0, 0
        except Exception:
            if runs:
                yield runs
            raise
        if runs:
            yield runs

    def _runs(self, discovery_lock: threading.Lock) -> Iterator[PageRun]:
        partition_id = self.plan.partition_id
        cursor = self.plan.cursor
        for attempt in range(1, _MAX_REDISCOVERIES + 2):
            try:
                for run in self.client.page_runs(partition_id, cursor):
                    yield run
                    cursor = run.cursor
                return
            except RediscoveryNeeded:
                # the discovery token changed (published dialect): discover again and go on from
                # the last cursor, unless the partition vanished in a method-2 split
                if attempt > _MAX_REDISCOVERIES:
                    raise
                with discovery_lock:
                    info = self.client.discover()
                log.info("partition %s: discovery token changed; rediscovered", partition_id)
                if info.partition(partition_id) is None:
                    return

    def _rows(self, runs: list[PageRun]) -> RowGroup:
        batch = EventBatch(self.event_id_field)
        duplicates = 0
        for run in runs:
            raws, ends, size = run.raw_events, run.ends, run.payload_bytes
            if self.seen_ids is not None:
                raws, ends = _unseen(raws, ends, event_ids(raws, self.event_id_field), self.seen_ids)
                duplicates += len(run.raw_events) - len(raws)
                size = sum(map(len, raws))
            batch.add(run.partition_id, self.position, raws, ends, run.cursors, size)
            self.position += len(raws)
        return RowGroup(self.plan.partition_id, batch.to_arrow(), runs[-1].cursor, self.position,
                        sum(len(run.ends) for run in runs), duplicates, batch.size)


def _unseen(raws: list[bytes], ends: list[int], ids: list[bytes | None],
            seen: set[bytes]) -> tuple[list[bytes], list[int]]:
    """The events whose id was not seen (adding theirs), and the pages' new ends."""
    kept: list[bytes] = []
    kept_ends: list[int] = []
    start = 0
    for end in ends:
        for raw, event_id in zip(raws[start:end], ids[start:end]):
            if event_id is not None:
                if event_id in seen:
                    continue
                seen.add(event_id)
            kept.append(raw)
        kept_ends.append(len(kept))
        start = end
    return kept, kept_ends


class ReaderPool:
    """Runs readers in `threads` threads of this process, or spread over `processes` reader
    processes of `threads` threads each. Iterate `messages()` until every reader has ended.

    Each reader process has a pipe of its own (nothing shared between processes): one killed in the
    middle of a message leaves the others' channels whole, and its own ends in EOF here."""

    def __init__(self, readers: list[PartitionReader], *, threads: int, processes: int, queued: int):
        self.readers = readers
        self.threads = max(1, threads)
        self.processes = processes
        if processes:
            context = multiprocessing.get_context("spawn")  # fork is unsafe in a threaded run process
            self._channels: dict = {}
            with _main_module_hidden():
                for n in range(processes):
                    receive, send = context.Pipe(duplex=False)
                    worker = context.Process(target=_reader_process, args=(readers[n::processes], send, self.threads),
                                             name=f"feedapi-reader-{n}", daemon=True)
                    worker.start()
                    send.close()  # the child holds the only write end: its exit is EOF here
                    self._channels[receive] = worker
        else:
            self._queue: queue.Queue = queue.Queue(maxsize=queued)
            self._stop = threading.Event()
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="feedapi-fetch")
            lock = threading.Lock()
            for reader in readers:
                self._pool.submit(reader.run, self._put, lock)

    def messages(self) -> Iterator[Message]:
        source = self._from_processes() if self.processes else self._from_threads()
        ended = 0
        for message in source:
            if message[0] != "group":
                ended += 1
            yield message
            if ended == len(self.readers):
                return

    def _from_threads(self) -> Iterator[Message]:
        while True:
            yield self._queue.get()

    def _from_processes(self) -> Iterator[Message]:
        channels = dict(self._channels)
        while channels:
            for channel in wait(list(channels)):
                try:
                    yield channel.recv()
                except (EOFError, OSError):
                    worker = channels.pop(channel)
                    worker.join(timeout=5)
                    if worker.exitcode != 0:
                        # killed, out of memory: its partitions stay unfinished, and nothing it read is
                        # committed (it is read again next time)
                        raise RuntimeError(f"reader process {worker.name} died (exit code {worker.exitcode}) "
                                           "before its partitions were read; nothing it read is committed") from None
        raise RuntimeError("the reader processes ended before every partition was read")

    def _put(self, message: Message) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(message, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def close(self) -> None:
        """Stops the readers and waits for them: reader threads blocked on a full queue give up; reader
        processes see their pipe closed at their next hand-off."""
        if self.processes:
            for channel, worker in self._channels.items():
                channel.close()
                worker.join(timeout=10)
                if worker.is_alive():
                    worker.terminate()
                    worker.join(timeout=5)
        else:
            self._stop.set()
            self._pool.shutdown(wait=True)

    def __enter__(self) -> "ReaderPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Spawned readers need only this package, not the launching program: with `__main__`'s file
    and spec hidden while they start, `spawn` does not re-run the program's main module in them
    (dagster's CLI: ~0.7 s of imports per reader; a script without a main guard: a second load)."""
    main = sys.modules["__main__"]
    saved = {name: main.__dict__[name] for name in ("__file__", "__spec__") if name in main.__dict__}
    main.__spec__ = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(main, name, value)


def _reader_process(readers: list[PartitionReader], channel: Connection, threads: int) -> None:
    send_lock, discovery_lock = threading.Lock(), threading.Lock()
    closed = threading.Event()

    def emit(message: Message) -> bool:
        # a full pipe blocks: the load's writer is behind (back-pressure); a closed one means the load
        # ended or died, and nobody will commit what this process reads
        if closed.is_set():
            return False
        try:
            with send_lock:
                channel.send(message)
            return True
        except OSError:
            closed.set()
            return False

    with ThreadPoolExecutor(threads, thread_name_prefix="feedapi-fetch") as pool:
        for reader in readers:
            pool.submit(reader.run, emit, discovery_lock)
    channel.close()
