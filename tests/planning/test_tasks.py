"""How a load's feed partitions are spread over Spark read tasks: by expected size, not one each."""

from hypothesis import given
from hypothesis import strategies as st

from feedapi_dagster.planning import DEFAULT_TASKS, task_groups


def test_large_partitions_get_a_task_each_and_small_ones_share():
    expected = {0: 1_000_000, 1: 900_000, **{pid: 10 for pid in range(2, 2002)}}
    groups = task_groups(expected, tasks=4)
    assert len(groups) == 4
    assert [0] in groups and [1] in groups  # the two large ones alone
    small = [group for group in groups if group not in ([0], [1])]
    assert sorted(len(group) for group in small) == [1000, 1000]


def test_a_first_load_spreads_equal_partitions_evenly_and_caps_the_tasks():
    groups = task_groups({pid: 0 for pid in range(2000)})
    assert len(groups) == DEFAULT_TASKS and {len(group) for group in groups} == {125}
    assert task_groups({pid: 0 for pid in range(5)}) == [[0], [1], [2], [3], [4]]
    assert task_groups({}) == []


@given(st.dictionaries(st.integers(0, 32767), st.integers(0, 10**6), max_size=300), st.integers(1, 40))
def test_every_partition_is_read_by_exactly_one_task(expected, tasks):
    groups = task_groups(expected, tasks)
    assert sorted(pid for group in groups for pid in group) == sorted(expected)
    assert len(groups) <= tasks and all(groups)
    if expected:  # no task is left with more than the mean plus the largest partition
        loads = [sum(max(expected[pid], 1) for pid in group) for group in groups]
        total = sum(max(size, 1) for size in expected.values())
        assert max(loads) <= total / len(groups) + max(max(size, 1) for size in expected.values())
