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
from pathlib import Path
from urllib.parse import urlsplit

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from feedapi_dagster.planning import PartitionPlan, PartitionState, PlanStatus, plan_feed, plan_rebuild
from feedapi_dagster.protocol import FeedClient, FeedInfo, Page, RediscoveryNeeded

from .sink import DeltaSink
from .table import arrow_batch, rows_frame

log = logging.getLogger(__name__)

# Moments a load passes through, reported to `on_moment` (progress logs; tests kill the process there).
BEFORE_COMMIT = "before_commit"
_MAX_REDISCOVERIES = 3
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
class _Batch:
    partition_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    cursors: list[str] = field(default_factory=list)
    raws: list[bytes] = field(default_factory=list)
    size: int = 0


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
        self._id_decoder = msgspec.json.Decoder(
            msgspec.defstruct("EventId", [(sink.event_id_field, msgspec.Raw | msgspec.UnsetType, msgspec.UNSET)]))

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
        staging = f"{self.sink.path}/_feedapi_staging/{uuid.uuid4().hex}" if rebuild else None
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
                _remove_local(staging)
        return {pid: item.report for pid, item in progress.items()}

    def _write_loop(self, progress: dict[int, _Progress], pages: queue.Queue, staging: str | None,
                    drop: list[int]) -> None:
        batch = _Batch()
        open_partitions = len(progress)
        while open_partitions:
            kind, partition_id, payload = pages.get()
            item = progress[partition_id]
            if kind == "page":
                self._add_page(item, payload, batch)
                if batch.size >= self.settings.batch_bytes or len(batch.raws) >= self.settings.batch_events:
                    self._flush(progress, batch, staging=staging)
                    batch = _Batch()
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
        try:
            for attempt in range(1, _MAX_REDISCOVERIES + 2):
                try:
                    for page in self.client.pages(plan.partition_id, cursor):
                        if not _put(pages, ("page", plan.partition_id, page), stop):
                            return
                        cursor, done = page.cursor, page.done
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
            _put(pages, ("error", plan.partition_id, str(error)), stop)
            return
        _put(pages, ("end", plan.partition_id, done), stop)

    def _add_page(self, item: _Progress, page: Page, batch: _Batch) -> None:
        raws = page.raw_events
        if item.seen_ids is not None:
            raws = self._unseen(raws, item.seen_ids)
            item.report.duplicates += len(page.raw_events) - len(raws)
        if raws:
            position = item.state.position
            batch.partition_ids.extend([page.partition_id] * len(raws))
            batch.positions.extend(range(position, position + len(raws)))
            batch.cursors.extend([page.cursor] * len(raws))
            batch.raws.extend(raws)
            batch.size += sum(map(len, raws))
        item.state = item.state.model_copy(update={"cursor": page.cursor, "position": item.state.position + len(raws)})
        item.dirty = True
        item.report.pages += 1
        item.report.events += len(raws)

    def _unseen(self, raws: list[bytes], seen: set[str]) -> list[bytes]:
        kept = []
        for raw in raws:
            if raw[:1] == b"{":
                event_id = getattr(self._id_decoder.decode(raw), self.sink.event_id_field)
                if event_id is not msgspec.UNSET:
                    key = msgspec.json.decode(event_id) if bytes(event_id)[:1] == b'"' else bytes(event_id).decode()
                    if not isinstance(key, str):
                        key = str(key)
                    if key in seen:
                        continue
                    seen.add(key)
            kept.append(raw)
        return kept

    def _flush(self, progress: dict[int, _Progress], batch: _Batch, *, staging: str | None,
               final: bool = False, drop: Iterable[int] = ()) -> None:
        rows = arrow_batch(batch.partition_ids, batch.positions, batch.cursors, batch.raws)
        if staging and not final:
            # a rebuild's earlier batches wait in a staging table until the one final commit
            rows_frame(self.sink.spark, rows, self.sink.event_id_field, self.sink.run_id) \
                .write.format("delta").mode("append").save(staging)
            return
        dirty = {pid: item for pid, item in progress.items() if item.dirty}
        if not dirty and not rows.num_rows and not staging:
            return
        updates = {pid: item.state for pid, item in dirty.items()}
        expected = {pid: item.expected for pid, item in dirty.items()}
        replace = [*progress, *drop] if staging else []
        staged = None
        if staging and Path(_local(staging)).exists():
            staged = self.sink.spark.read.format("delta").load(staging)
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
