"""Planning: which partition to read next from which cursor, and a columns table's typed columns for a write. Pure
(no I/O, no Spark, no Dagster)."""

from .feed_state import FeedState, PartitionState
from .plan import PartitionPlan, PlanStatus, plan_feed, plan_partition, plan_rebuild, plan_rebuilds
from .tasks import DEFAULT_TASKS, task_groups

__all__ = [
    "DEFAULT_TASKS",
    "FeedState",
    "PartitionPlan",
    "PartitionState",
    "PlanStatus",
    "plan_feed",
    "plan_partition",
    "plan_rebuild",
    "plan_rebuilds",
    "task_groups",
]
