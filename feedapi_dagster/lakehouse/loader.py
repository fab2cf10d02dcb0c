"""`FeedLoader`: moves pages from a `FeedClient` into a `DeltaSink`, many partitions per commit.

Fetching and writing overlap: partition readers (see `readers`: `fetch_workers` threads, in
`read_processes` reader processes or in this one) turn pages into groups of rows on a bounded queue,
while the calling thread batches the groups and commits. A batch closes at `batch_events` or
`batch_bytes`, so memory stays bounded whatever the partition size; each commit carries the cursor of
every group it covers (cursor-only pages and drained flags included).
"""
from __future__ import annotations

import logging
import shutil
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from pydantic import BaseModel, ConfigDict, Field

from feedapi_dagster.planning import PartitionPlan, PartitionState, PlanStatus, plan_feed, plan_rebuilds
from feedapi_dagster.protocol import FeedClient, FeedInfo

from .engines import STAGING_FOLDER, local_path
from .readers import PartitionReader, ReaderPool, RowGroup
from .sink import DeltaSink
from .table import EVENT_SCHEMA

log = logging.getLogger(__name__)

# Moments a load passes through, reported to `on_moment` (progress logs; tests kill the process there).
BEFORE_COMMIT = "before_commit"
AFTER_COMMIT = "after_commit"


class LoadSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # None: the table engine's own (`DeltaRsEngine.batch_events`, `SparkEngine.batch_events`)
    batch_events: int | None = Field(default=None, ge=1)
    batch_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    # reader threads (in all); spread over `read_processes` processes, or in the load process when 0.
    # With the per-event work in Rust, threads load as fast as 2 processes, without the processes'
    # ~0.5 s start in every run; processes help when Python work per event is back (feed filters).
    fetch_workers: int = Field(default=8, ge=1)
    read_processes: int = Field(default=0, ge=0)
    # row groups waiting for the writer (reader threads; a reader process waits on its pipe instead)
    queued_groups: int = Field(default=16, ge=1)


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
    dirty: bool = False  # progress not committed yet


@dataclass
class _Batch:
    groups: list[pa.Table] = field(default_factory=list)
    events: int = 0
    size: int = 0

    def rows(self) -> pa.Table:
        return pa.concat_tables(self.groups) if self.groups else EVENT_SCHEMA.empty_table()


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
        self._batch_events = self.settings.batch_events or self.sink.engine.batch_events
        self.on_moment = on_moment or (lambda moment, updates: None)

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
        partitions = []
        for partition_id in partition_ids:
            partition = info.partition(partition_id)
            if partition is None:
                raise ValueError(f"partition {partition_id} is not in discovery; it cannot be rebuilt")
            partitions.append(partition)
        plans = plan_rebuilds(info, self.sink.state, partitions, list(drop))
        reports = {p.partition_id: _idle_report(p) for p in plans if not p.due}
        due = [p for p in plans if p.due]
        if due:  # rows of `drop` go only together with the rebuilt rows that take their place
            reports.update(self._load(info, due, rebuild=True, drop=list(drop)))
        return dict(sorted(reports.items()))

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
        seen: dict[int, set[bytes] | None] = {pid: None for pid in progress}
        if dedup:
            # a rebuild starts its partitions (and the dropped ones) afresh; ancestors' rows stay
            replaced = {*progress, *drop} if rebuild else set()
            groups = {pid: [p for p in _dedup_group(info, item.plan) if p not in replaced]
                      for pid, item in progress.items()}
            stored = self.sink.event_ids(p for group in groups.values() for p in group)
            seen = {pid: set().union(*(stored.get(p, set()) for p in group)) for pid, group in groups.items()}
        readers = [PartitionReader(self.client, item.plan, item.state.position, self.sink.event_id_field,
                                   seen[pid]) for pid, item in progress.items()]
        settings = self.settings
        processes = min(settings.read_processes, len(readers))
        staging = _Staging(f"{self.sink.path}/{STAGING_FOLDER}/{uuid.uuid4().hex}") if rebuild else None
        try:
            with ReaderPool(readers, threads=-(-settings.fetch_workers // max(processes, 1)), processes=processes,
                            queued=settings.queued_groups) as pool:
                self._write_loop(progress, pool, staging, drop)
        finally:
            if staging:
                _remove_local(staging.path)
        return {pid: item.report for pid, item in progress.items()}

    def _write_loop(self, progress: dict[int, _Progress], pool: ReaderPool, staging: "_Staging | None",
                    drop: list[int]) -> None:
        batch = _Batch()
        for kind, partition_id, payload in pool.messages():
            item = progress[partition_id]
            if kind == "group":
                self._add_group(item, payload, batch)
                if batch.size >= self.settings.batch_bytes or batch.events >= self._batch_events:
                    self._flush(progress, batch, staging=staging)
                    batch = _Batch()
            elif kind == "error":
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

    def _add_group(self, item: _Progress, group: RowGroup, batch: _Batch) -> None:
        batch.groups.append(group.rows)
        batch.events += group.rows.num_rows
        batch.size += group.size
        item.report.events += group.rows.num_rows
        item.report.pages += group.pages
        item.report.duplicates += group.duplicates
        item.state = item.state.model_copy(update={"cursor": group.cursor, "position": group.position})
        item.dirty = True

    def _flush(self, progress: dict[int, _Progress], batch: _Batch, *, staging: "_Staging | None",
               final: bool = False, drop: Iterable[int] = ()) -> None:
        rows = batch.rows()
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


def _dedup_group(info: FeedInfo, plan: PartitionPlan) -> list[int]:
    """A partition and its method-2 ancestors: their histories overlap."""
    partition = info.partition(plan.partition_id)
    return [plan.partition_id, *(partition.cursor_from if partition else [])]


def _idle_report(plan: PartitionPlan) -> PartitionReport:
    return PartitionReport(plan.partition_id, plan.status.value, plan.cursor, plan.position, plan.cursor,
                           drained=plan.status is PlanStatus.DRAINED, error=plan.reason or None)


def _remove_local(path: str) -> None:
    local = local_path(path)
    if local:
        shutil.rmtree(local, ignore_errors=True)
    else:
        log.warning("staging table %s left behind: remove it with your storage tools", path)
