"""Which partitions to read next, and from which cursor. Pure: discovery + state in, plans out.

Rules (see docs/feedapi-protocol.md, "Partitions and splits"):
* a drained partition (closed and read to its end) needs nothing more;
* a method-1 child (`starts_after`) waits until its parent is drained, then starts from `_first`;
* a method-2 child (`cursor_from`) starts from the stored cursor of the first listed ancestor that
  has one, so the redistributed history is not loaded twice; with none, from `_first`;
* everything else continues from its own cursor.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import StrEnum
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

from feedapi_dagster.protocol.models import FIRST, FeedInfo, Partition

from .feed_state import FeedState, PartitionState


class PlanStatus(StrEnum):
    DUE = "due"  # load it now
    DRAINED = "drained"  # closed and read to its end
    WAITING = "waiting"  # a method-1 child whose parent is not drained yet
    INVALID = "invalid"  # discovery contradicts itself for this partition


class PartitionPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    partition_id: int
    status: PlanStatus
    cursor: str = FIRST
    position: int = 0
    closed: bool = False
    # The ancestor whose cursor a method-2 child starts from (first load only).
    inherited_from: int | None = None
    reason: str = ""

    @property
    def due(self) -> bool:
        return self.status is PlanStatus.DUE

    def start_state(self) -> PartitionState:
        return PartitionState(cursor=self.cursor, position=self.position, inherited_from=self.inherited_from)


def plan_partition(partition: Partition, info: FeedInfo, state: FeedState) -> PartitionPlan:
    own = state.get(partition.id)
    if own is not None and own.drained:
        return _at_own_cursor(partition, own, PlanStatus.DRAINED)
    if partition.starts_after is not None:
        waiting = _parent_block(partition.starts_after, info, state)
        if waiting is not None:
            return _at_own_cursor(partition, own, waiting.status, reason=waiting.reason)
    if own is not None:
        return _at_own_cursor(partition, own, PlanStatus.DUE, inherited_from=own.inherited_from)
    return _from_ancestor(partition, state, "continues from partition {}'s cursor (method-2 split)")


def _at_own_cursor(
    partition: Partition,
    own: PartitionState | None,
    status: PlanStatus,
    *,
    reason: str = "",
    inherited_from: int | None = None,
) -> PartitionPlan:
    """A plan at the partition's own committed cursor and position (`_first` and 0 without one)."""
    own = own if own is not None else PartitionState()
    return PartitionPlan(
        partition_id=partition.id,
        status=status,
        closed=partition.closed,
        cursor=own.cursor,
        position=own.position,
        inherited_from=inherited_from,
        reason=reason,
    )


class _Block(NamedTuple):
    """Why a method-1 child cannot start yet."""

    status: PlanStatus
    reason: str


def _parent_block(parent_id: int, info: FeedInfo, state: FeedState) -> _Block | None:
    """Why a method-1 child of partition `parent_id` cannot start yet (None when it can)."""
    parent_state = state.get(parent_id)
    if parent_state is not None and parent_state.drained:
        return None
    parent = info.partition(parent_id)
    if parent is None:
        return _Block(
            PlanStatus.INVALID,
            f"startsAfterPartition points at partition {parent_id}, which discovery does not list",
        )
    if not parent.closed:
        return _Block(
            PlanStatus.INVALID,
            f"startsAfterPartition points at partition {parent_id}, which is still open",
        )
    return _Block(PlanStatus.WAITING, f"waits until partition {parent_id} is drained (method-1 split)")


def plan_rebuilds(
    info: FeedInfo, state: FeedState, partitions: list[Partition], drop: list[int]
) -> list[PartitionPlan]:
    """Plans to rebuild `partitions` (rows replaced, with those of `drop`, in one commit).

    A method-1 child whose parent is not drained is not rebuilt either: it waits, as in a sync, and
    its rows stay (it is not among the replaced partitions the others plan with)."""
    blocked = {
        p.id: block
        for p in partitions
        if p.starts_after is not None and (block := _parent_block(p.starts_after, info, state)) is not None
    }
    replaced = {p.id for p in partitions if p.id not in blocked} | set(drop)
    plans = []
    for partition in partitions:
        if partition.id in blocked:
            waiting = blocked[partition.id]
            plans.append(_at_own_cursor(partition, state.get(partition.id), waiting.status, reason=waiting.reason))
        else:
            plans.append(plan_rebuild(partition, state, replaced))
    return plans


def plan_feed(info: FeedInfo, state: FeedState) -> list[PartitionPlan]:
    """A plan for every partition discovery lists, in id order."""
    return [plan_partition(p, info, state) for p in sorted(info.partitions, key=lambda p: p.id)]


def plan_rebuild(partition: Partition, state: FeedState, replaced: set[int]) -> PartitionPlan:
    """Where a rebuild of `partition` starts: its rows are replaced, so it re-reads what it owns.

    A method-2 child owns only what came after the cursor it inherited, as long as that ancestor's rows
    stay in the table; ancestors whose rows are replaced too (`replaced`) give their history back.
    """
    return _from_ancestor(partition, state, "rebuilt from partition {}'s cursor, whose rows stay", skip=replaced)


def _from_ancestor(partition: Partition, state: FeedState, reason: str, skip: Collection[int] = ()) -> PartitionPlan:
    """A method-2 child's plan: from the cursor of its nearest ancestor (`cursor_from`, nearest first)
    that has one, outside `skip`; `reason` names it (`{}`). From `_first` when none has."""
    for ancestor in partition.cursor_from:
        if ancestor in skip:
            continue
        ancestor_state = state.get(ancestor)
        if ancestor_state is not None and ancestor_state.cursor != FIRST:
            return PartitionPlan(
                partition_id=partition.id,
                status=PlanStatus.DUE,
                closed=partition.closed,
                cursor=ancestor_state.cursor,
                inherited_from=ancestor,
                reason=reason.format(ancestor),
            )
    return PartitionPlan(partition_id=partition.id, status=PlanStatus.DUE, closed=partition.closed)
