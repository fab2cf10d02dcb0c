"""What a load did: a `PartitionReport` per partition (what its Dagster materialization records) and the
`LoadOutcome` of the whole load."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from feedapi_dagster.lakehouse.cursor_record import CommittedState
from feedapi_dagster.lakehouse.feed_read import PartitionEnd
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.planning import PartitionPlan, PartitionState, PlanStatus
from feedapi_dagster.protocol import FeedInfo


class LoadStatus(StrEnum):
    """A partition's status after a load (a `StrEnum`: the values are those the materializations hold)."""

    LOADED = "loaded"  # read (and what it read committed); `delta_version` None: nothing new
    DRAINED = "drained"  # closed and read to its end before this load
    WAITING = "waiting"  # a method-1 child whose parent is not drained yet (`waiting_for` says which)
    INVALID = "invalid"  # discovery contradicts itself for this partition (`error` says how)
    FAILED = "failed"  # its read or its commit failed (`error`); what was committed before is kept

    @property
    def succeeded(self) -> bool:
        """Whether the partition is where it should be (a waiting partition waits as it should)."""
        return self in (LoadStatus.LOADED, LoadStatus.DRAINED, LoadStatus.WAITING)


@dataclass(frozen=True, kw_only=True)
class PartitionReport:
    """What one sync did to one partition (what a Dagster materialization records)."""

    partition_id: int
    status: LoadStatus
    cursor: str  # where the partition is now: its cursor of record when the load committed
    position: int
    start_cursor: str  # where this load started reading it
    events: int = 0
    pages: int = 0
    duplicates: int = 0
    drained: bool = False
    rebuilt: bool = False
    inherited_from: int | None = None
    error: str | None = None  # why it failed (FAILED, INVALID)
    waiting_for: str | None = None  # what a WAITING partition waits for (the plan's reason)
    delta_version: int | None = None
    bounded: bool = False  # the read stopped at `max_events_per_partition`: there may be more
    # the partition's own read: wall time from its first request to its checkpoint row (in a task that
    # reads it among others, while Spark writes what it read)
    read_seconds: float = 0.0
    # the load's wall time that read it, from the start of the Spark job to its commit (a partition's
    # own read is a small part of it: Spark's tasks, the write and the commits are the load's)
    load_seconds: float = 0.0
    gap: str | None = None  # events the server's retention dropped after the cursor, unread
    repeated_ids: int = 0  # ids an exactly-once feed sent more than once in this sync's reads (kept)
    repeated_examples: tuple[str, ...] = ()
    # a variant table's (`payload_form.py`): rows the load committed whose payload Spark could not parse
    # (`data` NULL, the text in `payload`); None for a json table, or where Spark did not report the count
    unparsed_payloads: int | None = None
    # a columns table's (`typed_columns.py`): rows the load committed with values in `_rescued_data`
    # (None as above), and the payload columns its commits added or gave new nested fields
    rescued_values: int | None = None
    columns_added: tuple[str, ...] = ()
    columns_extended: tuple[str, ...] = ()

    @classmethod
    def unmoved(
        cls, *, partition_id: int, status: LoadStatus, state: PartitionState, **details: Any
    ) -> PartitionReport:
        """A partition the load leaves at `state` (its start is where it is)."""
        return cls(
            partition_id=partition_id,
            status=status,
            cursor=state.cursor,
            position=state.position,
            start_cursor=state.cursor,
            drained=state.drained,
            inherited_from=state.inherited_from,
            **details,
        )

    def but(self, **changes: Any) -> PartitionReport:
        """This report with `changes` (`dataclasses.replace`)."""
        return dataclasses.replace(self, **changes)

    def then(self, later: PartitionReport) -> PartitionReport:
        """This report followed by a later load of the same partition in the same sync."""
        return later.but(
            start_cursor=self.start_cursor,
            events=later.events + self.events,
            pages=later.pages + self.pages,
            duplicates=later.duplicates + self.duplicates,
            read_seconds=later.read_seconds + self.read_seconds,
            load_seconds=later.load_seconds + self.load_seconds,
            gap=later.gap or self.gap,
            repeated_ids=later.repeated_ids + self.repeated_ids,
            repeated_examples=(*self.repeated_examples, *later.repeated_examples)[:5],
            unparsed_payloads=_sum(self.unparsed_payloads, later.unparsed_payloads),
            rescued_values=_sum(self.rescued_values, later.rescued_values),
            columns_added=(*self.columns_added, *later.columns_added),
            columns_extended=tuple(dict.fromkeys((*self.columns_extended, *later.columns_extended))),
        )

    def state(self) -> PartitionState:
        """The partition's state where this report leaves it."""
        return PartitionState(
            cursor=self.cursor, position=self.position, drained=self.drained, inherited_from=self.inherited_from
        )


def _sum(count: int | None, later: int | None) -> int | None:
    """Two loads' counts; None (unknown) where either is."""
    return None if count is None or later is None else count + later


@dataclass(frozen=True)
class LoadOutcome:
    """What one load did: a report per partition, the discovery it planned from, the table it wrote and
    the cursor of record after it (what the Dagster layer records, checks and maintains)."""

    reports: dict[int, PartitionReport]
    info: FeedInfo
    table: FeedTable
    committed: CommittedState


def idle_report(plan: PartitionPlan) -> PartitionReport:
    """The report of a partition its plan does not load now (drained, waiting or invalid)."""
    waiting = plan.status is PlanStatus.WAITING
    return PartitionReport.unmoved(
        partition_id=plan.partition_id,
        status=LoadStatus(plan.status.value),
        state=PartitionState(cursor=plan.cursor, position=plan.position, drained=plan.status is PlanStatus.DRAINED),
        waiting_for=(plan.reason or None) if waiting else None,
        error=None if waiting else plan.reason or None,
    )


def read_report(
    plan: PartitionPlan, start: PartitionState, end: PartitionEnd | None, events: int, *, rebuilt: bool
) -> PartitionReport:
    """The report of a partition read from `start` to `end`, `events` of its events written (the others
    were in the table already)."""
    begun = PartitionReport.unmoved(
        partition_id=plan.partition_id,
        status=LoadStatus.LOADED,
        state=start.model_copy(update={"drained": False, "inherited_from": plan.inherited_from}),
        rebuilt=rebuilt,
    )
    if end is None:  # cannot happen with a whole read; never commit a guess
        return begun.but(status=LoadStatus.FAILED, error="the read of this partition left no checkpoint row")
    read = end.read
    return begun.but(
        status=LoadStatus.FAILED if read.error else LoadStatus.LOADED,
        error=read.error or None,
        cursor=end.cursor,
        position=start.position + events,
        events=events,
        pages=read.pages,
        drained=read.drained,
        duplicates=read.duplicates + (read.events - events),
        bounded=read.bounded,
        read_seconds=read.seconds,
        repeated_ids=read.repeated_ids,
        repeated_examples=read.repeated_examples,
    )
