from feedapi_dagster.planning import FeedState, PartitionState, PlanStatus, plan_feed
from feedapi_dagster.protocol import FeedInfo, Partition


def info(*partitions, dialect="draft"):
    return FeedInfo(
        protocol="feedapi",
        dialect=dialect,
        exactly_once=True,
        partitions=[Partition.model_validate(p) for p in partitions],
    )


def by_id(plans):
    return {p.partition_id: p for p in plans}


def test_new_partitions_start_from_first_and_known_ones_continue():
    state = FeedState(partitions={0: PartitionState(cursor="c5", position=5)})
    plans = by_id(plan_feed(info({"id": 0}, {"id": 1}), state))
    assert (plans[0].status, plans[0].cursor, plans[0].position) == (PlanStatus.DUE, "c5", 5)
    assert (plans[1].status, plans[1].cursor, plans[1].position) == (PlanStatus.DUE, "_first", 0)


def test_drained_partitions_need_nothing_but_closed_undrained_ones_are_due():
    state = FeedState(
        partitions={
            0: PartitionState(cursor="c9", position=9, drained=True),
            1: PartitionState(cursor="c3", position=3),
        }
    )
    plans = by_id(plan_feed(info({"id": 0, "closed": True}, {"id": 1, "closed": True}), state))
    assert plans[0].status is PlanStatus.DRAINED
    assert plans[1].status is PlanStatus.DUE and plans[1].closed and plans[1].cursor == "c3"


def test_method1_children_wait_for_the_parent_to_drain():
    discovery = info(
        {"id": 0, "closed": True}, {"id": 1, "startsAfterPartition": 0}, {"id": 2, "startsAfterPartition": 0}
    )
    plans = by_id(plan_feed(discovery, FeedState(partitions={0: PartitionState(cursor="c5", position=5)})))
    assert plans[0].status is PlanStatus.DUE
    assert plans[1].status is PlanStatus.WAITING and "partition 0" in plans[1].reason
    drained = FeedState(partitions={0: PartitionState(cursor="c9", position=9, drained=True)})
    plans = by_id(plan_feed(discovery, drained))
    assert plans[1].status is PlanStatus.DUE and plans[1].cursor == "_first"


def test_method1_parent_open_or_unknown_is_invalid_for_the_child_only():
    plans = by_id(
        plan_feed(
            info({"id": 0}, {"id": 1, "startsAfterPartition": 0}, {"id": 2, "startsAfterPartition": 7}), FeedState()
        )
    )
    assert plans[0].status is PlanStatus.DUE
    assert plans[1].status is PlanStatus.INVALID and "still open" in plans[1].reason
    assert plans[2].status is PlanStatus.INVALID and "does not list" in plans[2].reason


def test_method2_children_start_from_the_first_ancestor_with_a_cursor():
    state = FeedState(partitions={3: PartitionState(cursor="c40", position=40), 1: PartitionState(cursor="c10")})
    discovery = info({"id": 7, "cursorFromPartitions": ["5", "3", "1"]}, {"id": 8, "cursorFromPartitions": ["9"]})
    plans = by_id(plan_feed(discovery, state))
    assert (plans[7].cursor, plans[7].inherited_from, plans[7].position) == ("c40", 3, 0)
    assert (plans[8].cursor, plans[8].inherited_from) == ("_first", None)
    # once the child has its own state, that wins
    state = state.advanced({7: PartitionState(cursor="c55", position=4, inherited_from=3)})
    assert by_id(plan_feed(discovery, state))[7].cursor == "c55"


def test_state_generation_advances_and_keeps_vanished_partitions():
    state = FeedState(partitions={0: PartitionState(cursor="c1")})
    later = state.advanced({1: PartitionState(cursor="c2")})
    assert later.generation == 1 and set(later.partitions) == {0, 1}


def test_a_rebuild_of_a_method2_child_starts_where_its_kept_ancestors_end():
    from feedapi_dagster.planning import plan_rebuild

    child = Partition.model_validate({"id": 7, "cursorFromPartitions": [3, 1]})
    state = FeedState(
        partitions={
            3: PartitionState(cursor="c40"),
            1: PartitionState(cursor="c10"),
            7: PartitionState(cursor="c90", position=12, inherited_from=3),
        }
    )
    assert (plan_rebuild(child, state, {7}).cursor, plan_rebuild(child, state, {7}).inherited_from) == ("c40", 3)
    assert plan_rebuild(child, state, {7, 3}).cursor == "c10"  # the parent's rows go too: from the grandparent
    assert plan_rebuild(child, state, {7, 3, 1}).cursor == "_first"
    assert plan_rebuild(Partition(id=2), state, {2}).cursor == "_first"


def test_a_rebuild_does_not_start_a_method1_child_before_its_parent_is_drained():
    from feedapi_dagster.planning import plan_rebuilds

    discovery = info(
        {"id": 0, "closed": True}, {"id": 1, "startsAfterPartition": 0}, {"id": 2, "cursorFromPartitions": [1]}
    )
    parent, child, grandchild = discovery.partitions
    undrained = FeedState(
        partitions={0: PartitionState(cursor="c5", position=5), 1: PartitionState(cursor="c2", position=2)}
    )
    plans = by_id(plan_rebuilds(discovery, undrained, [parent, child, grandchild], []))
    assert plans[0].status is PlanStatus.DUE and plans[0].cursor == "_first"
    assert plans[1].status is PlanStatus.WAITING and "partition 0" in plans[1].reason
    assert (plans[1].cursor, plans[1].position) == ("c2", 2)  # untouched
    # the waiting child's rows stay, so a method-2 grandchild still starts after them
    assert plans[2].status is PlanStatus.DUE and (plans[2].cursor, plans[2].inherited_from) == ("c2", 1)
    drained = FeedState(partitions={0: PartitionState(cursor="c9", position=9, drained=True)})
    plans = by_id(plan_rebuilds(discovery, drained, [child], []))
    assert plans[1].status is PlanStatus.DUE and plans[1].cursor == "_first"
