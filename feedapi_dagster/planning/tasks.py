"""Which feed partitions each Spark read task reads: cost by events, not by partitions.

A task reads its partitions concurrently (a few HTTP reads at a time), so a task of a hundred small
partitions costs little more than one of a single partition; Spark's parallelism comes from the
tasks. Partitions are spread over the tasks by their expected size, largest first, each to the task
with the least so far (longest-processing-time first): a large partition gets a task of its own, small
ones share.
"""

from __future__ import annotations

from collections.abc import Mapping

# read tasks of a load when not told otherwise: enough for the cores of a small cluster, few enough
# that a load of thousands of small partitions pays a few task start-ups, not thousands
DEFAULT_TASKS = 16


def task_groups(expected: Mapping[int, int], tasks: int | None = None) -> list[list[int]]:
    """The partitions of `expected` (id -> expected events, any non-negative weight) in at most
    `tasks` groups, each sorted by id; the groups in order of their first partition."""
    count = max(1, min(len(expected), tasks or DEFAULT_TASKS))
    groups: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    # ties (equal sizes, e.g. a first load) go round-robin in id order: neighbours spread over tasks
    for partition_id in sorted(expected, key=lambda pid: (-expected[pid], pid)):
        lightest = min(range(count), key=lambda index: (loads[index], len(groups[index])))
        groups[lightest].append(partition_id)
        loads[lightest] += max(expected[partition_id], 1)
    return sorted((sorted(group) for group in groups if group), key=lambda group: group[0])
