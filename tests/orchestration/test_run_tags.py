"""The partition ids a run is tagged with stay short enough for every run storage (PostgreSQL refused
a run tagged with 2,000 ids one by one: its tag index takes at most 8191 bytes a row)."""

import dagster as dg

from feedapi_dagster.orchestration.loads import (
    MAX_PARTITIONS_TAG_CHARS,
    PARTITION_LIMIT_TAG,
    PARTITIONS_TAG,
    partition_run_tags,
    partitions_tag,
)
from feedapi_dagster.orchestration.run_storage import listed_partitions, run_partitions


class _Binding:
    name = "orders"


def test_ids_go_as_ranges_and_read_back_as_they_were():
    assert partitions_tag([0, 1, 2]) == "0-2"
    assert partitions_tag([4, 3, 7, 9, 10, 11, 12, 0]) == "0,3,4,7,9-12"
    for ids in ({5}, {0, 1}, set(range(2000)), {1, 2, 3, 10, 12, *range(40, 400)}):
        assert listed_partitions({PARTITIONS_TAG: partitions_tag(ids)}) == ids
    assert listed_partitions({}) is None


def test_a_run_of_thousands_of_partitions_has_short_tags_and_loads_what_it_asked_for():
    order = [str(p) for p in range(10_000)]
    tags = partition_run_tags(_Binding(), range(2000), order)
    assert tags[PARTITIONS_TAG] == "0-1999"
    assert max(map(len, tags.values())) <= MAX_PARTITIONS_TAG_CHARS
    # every other partition of 10,000: no short list exists; the run is its key range, whose every due
    # partition it loads
    scattered = range(0, 10_000, 2)
    tags = partition_run_tags(_Binding(), scattered, order)
    assert PARTITIONS_TAG not in tags and max(map(len, tags.values())) <= MAX_PARTITIONS_TAG_CHARS
    run = dg.DagsterRun(job_name="feedapi_orders_load", tags=tags)
    assert run_partitions(run, order) == set(range(0, 9999))


def test_a_run_of_one_partition_is_tagged_with_its_feed_and_partition_for_the_run_queue():
    tags = partition_run_tags(_Binding(), [3], ["0", "3"])
    assert tags["dagster/partition"] == "3" and tags[PARTITION_LIMIT_TAG] == "orders/3"
    assert PARTITION_LIMIT_TAG not in partition_run_tags(_Binding(), [0, 3], ["0", "3"])
