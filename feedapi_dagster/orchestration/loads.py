"""What every Dagster entry point shares: a feed as the definitions bind it, the run configuration of
a load, the tags that say which partitions a run loads, and a load's failures as Dagster's. What the
instance knows of the runs is read in `run_storage.py`, what a load tells Dagster is in `metadata.py`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import dagster as dg

from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.protocol import ProtocolError

from .config import FeedConfig, ProjectConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from feedapi_dagster.lakehouse.load_report import PartitionReport

# The key the definitions bind the `FeedApiResource` to: the name of the parameter by which each feed's
# asset and maintenance op declare it.
RESOURCE_KEY = "feedapi"
# a key of the feeds' definitions' metadata per feed (`feedapi/table/orders`): the URI of its table
TABLE_METADATA_PREFIX = "feedapi/table/"
FEED_TAG = "feedapi/feed"
PARTITIONS_TAG = "feedapi/partitions"  # the partition ids a run of the sensor or the schedule loads (`partitions_tag`)
# The instance indexes run tags, and PostgreSQL refuses an index row over 8191 bytes: a run tagged with
# 2,000 ids one by one could not be created. Runs of 3+ ids go as ranges ("0-1999"), and a list still
# longer than this is left out: the run then loads every due partition of its key range.
MAX_PARTITIONS_TAG_CHARS = 1000
# On a run of one partition that the feed's sensor or schedule requests: "<feed>/<partition>", the key of
# the shipped dagster.yaml's limit of one run per partition of a feed (`dagster/partition` alone is
# "0" for partition 0 of every feed). Dagster's backfill runs carry only its own tags: the pool
# `feedapi_<feed>` and the asset's skipping of busy partitions hold them.
PARTITION_LIMIT_TAG = "feedapi/partition"
REBUILD_TAG = "feedapi/rebuild"
MAINTENANCE_TAG = "feedapi/maintenance"  # on the runs of a feed's maintenance job: the feed's name
# On the schedule's runs: a sync of every open partition, every few minutes. Its partitions with
# nothing new get no materialization (thousands of events per sync); the sync's observation says it.
SYNC_TAG = "feedapi/sync"
SCHEDULED_SYNC = "schedule"
BACKFILL_TAG = "dagster/backfill"
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"


class LoadConfig(dg.Config):
    """Run configuration of a load. Empty: bring every due partition of the run's keys up to date."""

    rebuild: list[int] = []  # partitions to reload from `_first`, their rows replaced atomically
    drop: list[int] = []  # partitions whose rows go in the same commit (the vanished parent of a split)


@dataclass(frozen=True)
class FeedBinding:
    """A feed as one code location defines it: its settings and its asset key (the translator's choice)."""

    project: ProjectConfig
    feed: FeedConfig
    key: dg.AssetKey

    @property
    def name(self) -> str:
        return self.feed.name

    @property
    def partitions_name(self) -> str:
        return f"feedapi_{self.feed.name}"

    @property
    def pool(self) -> str:
        """The Dagster pool of the feed's load, maintenance and stream steps (limit 1: one at a time)."""
        return f"feedapi_{self.feed.name}"

    @property
    def job_name(self) -> str:
        return f"feedapi_{self.feed.name}_load"

    @property
    def op_name(self) -> str:
        return self.key.to_python_identifier()

    @property
    def table_path(self) -> str:
        return self.project.table_path(self.feed)

    def table_for(self, spark: SparkSession) -> FeedTable:
        return FeedTable(
            spark,
            self.table_path,
            storage_options=self.project.storage_options(),
            layout=self.feed.layout,
            payload_form=self.feed.payload_form,
            columns=self.feed.payload_columns.settings(),
        )


def partition_run_tags(binding: FeedBinding, partition_ids: Iterable[int], order: Sequence[str]) -> dict[str, str]:
    """Tags of a run of the asset over `partition_ids`: one partition key, or the range of keys (in the
    order the instance lists the dynamic partitions) from the first to the last of them. The run loads
    every due partition of its range; our own tag says which ones were asked for, where it is short."""
    keys = {str(p) for p in partition_ids}
    tags = {FEED_TAG: binding.name}
    if len(listed := partitions_tag(int(key) for key in keys)) <= MAX_PARTITIONS_TAG_CHARS:
        tags[PARTITIONS_TAG] = listed
    if len(keys) == 1:
        tags["dagster/partition"] = key = next(iter(keys))
        tags[PARTITION_LIMIT_TAG] = f"{binding.name}/{key}"
    else:
        ordered = [key for key in order if key in keys]
        tags[RANGE_START_TAG], tags[RANGE_END_TAG] = ordered[0], ordered[-1]
    return tags


def partitions_tag(partition_ids: Iterable[int]) -> str:
    """Partition ids as a tag's value: "0-2,5,7,9-12"."""
    ids = sorted(set(partition_ids))
    runs: list[list[int]] = []
    for pid in ids:
        if runs and pid == runs[-1][-1] + 1:
            runs[-1].append(pid)
        else:
            runs.append([pid])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) >= 3 else ",".join(map(str, run)) for run in runs)


@contextmanager
def failing_clearly(feed: str, what: str) -> Iterator[None]:
    """A `ProtocolError` (the feed's server refused, retries ran out, an answer came cut short every
    time) as a `dg.Failure` of one line naming feed `feed` and `what` failed, without the chain of
    `requests` and `urllib3` exceptions beneath it: the client logged each attempt's."""
    try:
        yield
    except ProtocolError as error:
        raise dg.Failure(f"feed {feed}: {what} failed: {error}") from None


def failure(binding: FeedBinding, reports: Iterable[PartitionReport]) -> dg.Failure | None:
    problems = [f"partition {r.partition_id}: {r.error}" for r in reports if not r.status.succeeded]
    if not problems:
        return None
    return dg.Failure(
        description=f"feed {binding.name}: {len(problems)} partition(s) could not be loaded "
        "(what was committed before the failure is kept): " + "; ".join(problems),
        allow_retries=True,
    )
