"""The asset of a feed: one Delta table whose dynamic partitions are the feed's partitions.

Every load is a run of this asset, whoever starts it (the schedule, the discovery sensor, a backfill,
the UI): one partition key or a range of keys, all loaded by one Spark job per wave. Materializations
are logged per partition the load committed and per partition the run was asked for that it found
up to date (a backfill's partitions succeed), except in the schedule's syncs, where a partition with
nothing new keeps its latest materialization; every load logs one observation of the asset (when it
was synced, how far behind the feed it is). The checks run in the same step, after the commit, on
the partitions it committed. What the step runs is an `Execute`: by default `FeedApiResource.load`,
in a component its `execute`.
"""

import warnings
from collections.abc import Callable, Iterator

import dagster as dg

from .checks import feed_check_specs
from .loads import FeedBinding, LoadConfig
from .resources import FeedApiResource

LoadEvent = dg.AssetMaterialization | dg.AssetObservation | dg.AssetCheckResult
# what a feed's asset runs: (its context, the resource, the feed, the run's configuration) -> its events
Execute = Callable[[dg.AssetExecutionContext, FeedApiResource, FeedBinding, LoadConfig], Iterator[LoadEvent]]


def load_feed(
    context: dg.AssetExecutionContext, feedapi: FeedApiResource, binding: FeedBinding, config: LoadConfig
) -> Iterator[LoadEvent]:
    """What a feed's asset runs unless told otherwise: the load of the run's partitions."""
    return feedapi.load(context, binding, config)


def build_feed_asset(binding: FeedBinding, spec: dg.AssetSpec, execute: Execute = load_feed) -> dg.AssetsDefinition:
    with warnings.catch_warnings():
        # `backfill_policy` is beta in Dagster 1.13 and warns wherever the definitions load (every run's
        # log starts with it); this use of it is deliberate and tested (tests/orchestration)
        warnings.simplefilter("ignore", dg.BetaWarning)
        return _feed_asset(binding, spec, execute)


def _feed_asset(binding: FeedBinding, spec: dg.AssetSpec, execute: Execute) -> dg.AssetsDefinition:
    @dg.asset(
        key=spec.key,
        group_name=spec.group_name,
        kinds=spec.kinds,
        owners=spec.owners,
        tags=spec.tags,
        description=spec.description,
        metadata=spec.metadata,
        partitions_def=dg.DynamicPartitionsDefinition(name=binding.partitions_name),
        check_specs=feed_check_specs(spec.key, binding.feed),
        # one run may load many partitions: a backfill's contiguous keys become one range run
        backfill_policy=dg.BackfillPolicy.single_run(),
        # one load of a feed at a time (the instance sets the pool's limit; dagster.yaml ships 1)
        pool=binding.pool,
        # materializations are yielded per partition (`FeedApiResource.load`), not one per key of the range
        output_required=False,
    )
    def feed_asset(context: dg.AssetExecutionContext, config: LoadConfig, feedapi: FeedApiResource):
        yield from execute(context, feedapi, binding, config)

    return feed_asset
