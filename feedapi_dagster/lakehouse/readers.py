"""Partition readers: fetch a partition's pages and turn them into rows, off the writer's thread.

A `PartitionReader` owns one partition for one load: it pages from the plan's cursor, numbers the
events from the committed position, drops events whose id was seen (at-least-once feeds), derives the
columns and hands the writer `RowGroup`s: Arrow rows plus the cursor that covers them. The writer
only appends groups and commits; every cursor it commits comes from a group it holds.

Readers run as threads of the load process (`read_processes: 0`) or in reader processes. Parsing
NDJSON and deriving columns is CPU work under the GIL: in threads it competes with the writer, in
processes it runs on the other cores. Rows cross the process boundary as Arrow (pickled as Arrow
IPC, one copy).
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
from feedapi_dagster.protocol import FeedClient, Page, RediscoveryNeeded

from .table import EventBatch, event_ids

log = logging.getLogger(__name__)

_MAX_REDISCOVERIES = 3
# Feeds checkpoint every few events: a hand-off per page would cost more than the events themselves.
GROUP_EVENTS = 2000


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
            for pages in self._page_lists(discovery_lock):
                group = self._rows(pages)
                done = done or pages[-1].done
                if not emit(("group", partition_id, group)):
                    return
        except Exception as error:  # noqa: BLE001 - reported per partition; the others go on
            log.error("partition %s: %s", partition_id, error)
            emit(("error", partition_id, str(error)))
            return
        emit(("end", partition_id, done))

    def _page_lists(self, discovery_lock: threading.Lock) -> Iterator[list[Page]]:
        """The partition's pages in lists of about `GROUP_EVENTS` events; what was read before an
        error is yielded before the error is raised (it is good: it gets committed)."""
        pages: list[Page] = []
        count = 0
        try:
            for page in self._pages(discovery_lock):
                pages.append(page)
                count += len(page.raw_events)
                if count >= GROUP_EVENTS:
                    yield pages
                    pages, count = [], 0
        except Exception:
            if pages:
                yield pages
            raise
        if pages:
            yield pages

    def _pages(self, discovery_lock: threading.Lock) -> Iterator[Page]:
        partition_id = self.plan.partition_id
        cursor = self.plan.cursor
        for attempt in range(1, _MAX_REDISCOVERIES + 2):
            try:
                for page in self.client.pages(partition_id, cursor):
                    yield page
                    cursor = page.cursor
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

    def _rows(self, pages: list[Page]) -> RowGroup:
        batch = EventBatch(self.event_id_field)
        duplicates = 0
        for page in pages:
            raws = page.raw_events
            if self.seen_ids is not None:
                raws = _unseen(raws, event_ids(raws, self.event_id_field), self.seen_ids)
                duplicates += len(page.raw_events) - len(raws)
            batch.add(page.partition_id, self.position, page.cursor, raws)
            self.position += len(raws)
        return RowGroup(self.plan.partition_id, batch.to_arrow(), pages[-1].cursor, self.position, len(pages),
                        duplicates, batch.size)


def _unseen(raws: list[bytes], ids: list[bytes | None], seen: set[bytes]) -> list[bytes]:
    kept = []
    for raw, event_id in zip(raws, ids):
        if event_id is not None:
            if event_id in seen:
                continue
            seen.add(event_id)
        kept.append(raw)
    return kept


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
