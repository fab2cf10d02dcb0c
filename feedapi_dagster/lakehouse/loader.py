"""`FeedLoader`: moves pages from a `FeedClient` into a `DeltaSink`, many partitions per commit.

Fetching and writing overlap: one thread per partition (up to `fetch_workers`) pulls pages into a
bounded queue while the calling thread batches them and commits. A batch closes at `batch_events` or
`batch_bytes`, so memory stays bounded whatever the partition size; each commit carries the cursor of
every page it covers (cursor-only pages and drained flags included).
"""
from __future__ import annotations

import logging
import queue
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from feedapi_dagster.planning import PartitionPlan, PartitionState, PlanStatus, plan_feed, plan_rebuild
from feedapi_dagster.protocol import FeedClient, FeedInfo, Page, RediscoveryNeeded

from .sink import DeltaSink
from .table import EventBatch

log = logging.getLogger(__name__)

# Moments a load passes through, reported to `on_moment` (progress logs; tests kill the process there).
BEFORE_COMMIT = "before_commit"
_MAX_REDISCOVERIES = 3
_GROUP_EVENTS = 2000
AFTER_COMMIT = "after_commit"


class LoadSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_events: int = Field(default=200_000, ge=1)
    batch_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    fetch_workers: int = Field(default=8, ge=1)
    queued_pages: int = Field(default=64, ge=1)


@dataclass
class PartitionReport:
    """What one sync did to one partition (what a Dagster materialization records)."""

    partition_id: int
    status: str  # loaded | drained | waiting | invalid | failed
    cursor: str
    position: int
    start_cursor: str
    events: int = 0
    pages: int = 0
    duplicates: int = 0
    drained: bool = False
    rebuilt: bool = False
    inherited_from: int | None = None
    error: str | None = None
    delta_version: int | None = None


@dataclass
class _Progress:
    plan: PartitionPlan
    state: PartitionState  # progress so far (committed or buffered)
    expected: PartitionState | None  # what the table holds for it now
    report: PartitionReport
    seen_ids: set[str] | None = None
    dirty: bool = False  # progress not committed yet


@dataclass
class _Staging:
    path: str
    used: bool = False


class FeedLoader:
    def __init__(
        self,
        client: FeedClient,
        sink: DeltaSink,
        settings: LoadSettings | None = None,
        *,
        on_moment: Callable[[str, dict[int, PartitionState]], None] | None = None,
    ):
        self.client = client
        self.sink = sink
        self.settings = settings or LoadSettings()
        self.on_moment = on_moment or (lambda moment, updates: None)
        self._discovery_lock = threading.Lock()

    # ------------------------------------------------------------------ entry points
    def sync(self, partition_ids: Iterable[int] | None = None) -> dict[int, PartitionReport]:
        """Load every due partition (or the given ones) to where the feed is now.

        Method-1 children whose parent drains during this sync are loaded in a later wave of the
        same sync, so one scheduled run catches up a whole split.
        """
        info = self.client.info
        wanted = set(partition_ids) if partition_ids is not None else None
        reports: dict[int, PartitionReport] = {}
        loaded: set[int] = set()
        while True:
            plans = [p for p in plan_feed(info, self.sink.state)
                     if (wanted is None or p.partition_id in wanted) and p.partition_id not in loaded]
            due = [p for p in plans if p.due]
            reports.update({p.partition_id: _idle_report(p) for p in plans if not p.due})
            if not due:
                return dict(sorted(reports.items()))
            results = self._load(info, due, rebuild=False)
            reports.update(results)
            loaded.update(results)

    def rebuild(self, partition_ids: Iterable[int], drop: Iterable[int] = ()) -> dict[int, PartitionReport]:
        """Reload partitions from `_first` and replace their rows (and the rows of `drop`, e.g. the
        vanished parent of a method-2 split) in one commit: readers never see a half-rebuilt table."""
        info = self.client.info
        partition_ids, drop = list(partition_ids), list(drop)
        replaced = {*partition_ids, *drop}
        plans = []
        for partition_id in partition_ids:
            partition = info.partition(partition_id)
            if partition is None:
                raise ValueError(f"partition {partition_id} is not in discovery; it cannot be rebuilt")
            plans.append(plan_rebuild(partition, self.sink.state, replaced))
        return self._load(info, plans, rebuild=True, drop=drop)

    # ------------------------------------------------------------------ the pipeline
    def _load(self, info: FeedInfo, plans: list[PartitionPlan], *, rebuild: bool,
              drop: list[int] = ()) -> dict[int, PartitionReport]:
        committed = self.sink.state
        dedup = not info.exactly_once
        progress: dict[int, _Progress] = {}
        for plan in plans:
            start = plan.start_state()
            report = PartitionReport(plan.partition_id, "loaded", start.cursor, start.position, start.cursor,
                                     rebuilt=rebuild, inherited_from=plan.inherited_from)
            progress[plan.partition_id] = _Progress(plan, start, committed.get(plan.partition_id), report)
        if dedup:
            # a rebuild starts its partitions (and the dropped ones) afresh; ancestors' rows stay
            replaced = {*progress, *drop} if rebuild else set()
            groups = {pid: [p for p in _dedup_group(info, item.plan) if p not in replaced]
                      for pid, item in progress.items()}
            stored = self.sink.event_ids(p for group in groups.values() for p in group)
            for pid, item in progress.items():
                item.seen_ids = set().union(*(stored.get(p, set()) for p in groups[pid]))
        staging = _Staging(f"{self.sink.path}/_feedapi_staging/{uuid.uuid4().hex}") if rebuild else None
        pages: queue.Queue = queue.Queue(maxsize=self.settings.queued_pages)
        stop = threading.Event()
        try:
            with ThreadPoolExecutor(self.settings.fetch_workers, thread_name_prefix="feedapi-fetch") as pool:
                try:
                    for item in progress.values():
                        pool.submit(self._fetch, item.plan, pages, stop)
                    self._write_loop(progress, pages, staging, drop)
                finally:
                    stop.set()  # lets fetch threads blocked on a full queue give up
        finally:
            if staging:
                _remove_local(staging.path)
        return {pid: item.report for pid, item in progress.items()}

    def _write_loop(self, progress: dict[int, _Progress], pages: queue.Queue, staging: "_Staging | None",
                    drop: list[int]) -> None:
        batch = EventBatch()
        open_partitions = len(progress)
        while open_partitions:
            kind, partition_id, payload = pages.get()
            item = progress[partition_id]
            if kind == "pages":
                self._add_pages(item, payload, batch)
                if batch.size >= self.settings.batch_bytes or len(batch) >= self.settings.batch_events:
                    self._flush(progress, batch, staging=staging)
                    batch = EventBatch()
                continue
            open_partitions -= 1
            if kind == "error":
                item.report.status, item.report.error = "failed", payload
            elif item.plan.closed or payload:
                # closed and caught up, or finished by a `_done` checkpoint: drained
                item.state = item.state.model_copy(update={"drained": True})
                item.dirty = item.report.drained = True
        failed = [pid for pid, item in progress.items() if item.report.status == "failed"]
        if staging and failed:
            raise RuntimeError(f"rebuild of partitions {sorted(progress)} abandoned, nothing replaced: "
                               + "; ".join(f"partition {pid}: {progress[pid].report.error}" for pid in failed))
        self._flush(progress, batch, staging=staging, final=True, drop=drop)

    def _fetch(self, plan: PartitionPlan, pages: queue.Queue, stop: threading.Event) -> None:
        done = False
        cursor = plan.cursor
        # Pages travel to the writer in groups: feeds checkpoint every few events, and a hand-off
        # per page (queue, state copy) would cost more than the events themselves.
        group: list[Page] = []
        grouped = 0

        def send() -> bool:
            nonlocal group, grouped
            if not group:
                return True
            sent = _put(pages, ("pages", plan.partition_id, group), stop)
            group, grouped = [], 0
            return sent

        try:
            for attempt in range(1, _MAX_REDISCOVERIES + 2):
                try:
                    for page in self.client.pages(plan.partition_id, cursor):
                        group.append(page)
                        grouped += len(page.raw_events)
                        cursor, done = page.cursor, page.done
                        if grouped >= _GROUP_EVENTS and not send():
                            return
                    break
                except RediscoveryNeeded:
                    # the discovery token changed (published dialect): discover again and go on
                    # from the last cursor, unless the partition vanished in a method-2 split
                    if attempt > _MAX_REDISCOVERIES:
                        raise
                    with self._discovery_lock:
                        info = self.client.discover()
                    log.info("partition %s: discovery token changed; rediscovered", plan.partition_id)
                    if info.partition(plan.partition_id) is None:
                        break
        except Exception as error:  # noqa: BLE001 - reported per partition; the others go on
            log.error("partition %s: %s", plan.partition_id, error)
            # the pages before the failure are good: they are committed, the error is reported
            if send():
                _put(pages, ("error", plan.partition_id, str(error)), stop)
            return
        if send():
            _put(pages, ("end", plan.partition_id, done), stop)

    def _add_pages(self, item: _Progress, pages: list[Page], batch: EventBatch) -> None:
        event_id = self.sink.parser.event_id
        position = item.state.position
        for page in pages:
            raws = page.raw_events
            ids = [event_id(raw) for raw in raws]
            if item.seen_ids is not None:
                raws, ids = _unseen(raws, ids, item.seen_ids)
                item.report.duplicates += len(page.raw_events) - len(raws)
            batch.add(page.partition_id, position, page.cursor, raws, ids)
            position += len(raws)
        item.report.events += position - item.state.position
        item.report.pages += len(pages)
        item.state = item.state.model_copy(update={"cursor": pages[-1].cursor, "position": position})
        item.dirty = True

    def _flush(self, progress: dict[int, _Progress], batch: EventBatch, *, staging: "_Staging | None",
               final: bool = False, drop: Iterable[int] = ()) -> None:
        rows = batch.to_arrow()
        if staging and not final:
            # a rebuild's earlier batches wait in a staging table until the one final commit
            self.sink.stage(rows, staging.path)
            staging.used = True
            return
        dirty = {pid: item for pid, item in progress.items() if item.dirty}
        if not dirty and not rows.num_rows and not staging:
            return
        updates = {pid: item.state for pid, item in dirty.items()}
        expected = {pid: item.expected for pid, item in dirty.items()}
        replace = [*progress, *drop] if staging else []
        staged = staging.path if staging and staging.used else None
        self.on_moment(BEFORE_COMMIT, updates)
        result = self.sink.commit(rows, updates, expected, replace=replace, staged=staged)
        self.on_moment(AFTER_COMMIT, updates)
        for pid, item in dirty.items():
            item.expected, item.dirty = item.state, False
            item.report.cursor, item.report.position = item.state.cursor, item.state.position
            item.report.delta_version = result.delta_version
        log.info("committed %d events for partitions %s (Delta version %s)", rows.num_rows,
                 sorted(dirty), result.delta_version)


def _put(pages: queue.Queue, item: tuple, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            pages.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _unseen(raws: list[bytes], ids: list[str | None], seen: set[str]) -> tuple[list[bytes], list[str | None]]:
    kept_raws, kept_ids = [], []
    for raw, event_id in zip(raws, ids):
        if event_id is not None:
            if event_id in seen:
                continue
            seen.add(event_id)
        kept_raws.append(raw)
        kept_ids.append(event_id)
    return kept_raws, kept_ids


def _dedup_group(info: FeedInfo, plan: PartitionPlan) -> list[int]:
    """A partition and its method-2 ancestors: their histories overlap."""
    partition = info.partition(plan.partition_id)
    return [plan.partition_id, *(partition.cursor_from if partition else [])]


def _idle_report(plan: PartitionPlan) -> PartitionReport:
    return PartitionReport(plan.partition_id, plan.status.value, plan.cursor, plan.position, plan.cursor,
                           drained=plan.status is PlanStatus.DRAINED, error=plan.reason or None)


def _local(path: str) -> str:
    parts = urlsplit(path)
    return parts.path if parts.scheme in ("", "file") else ""


def _remove_local(path: str) -> None:
    local = _local(path)
    if local:
        shutil.rmtree(local, ignore_errors=True)
    else:
        log.warning("staging table %s left behind: remove it with your storage tools", path)
