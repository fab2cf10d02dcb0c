"""The asset of a feed: one Delta table whose dynamic partitions are the feed's partitions.

Every load is a run of this asset, whoever starts it (the schedule, the discovery sensor, a backfill,
the UI): one partition key or a range of keys, all loaded by one Spark job per wave. Materializations
are logged per partition the load committed and per partition the run was asked for that it found
up to date (a backfill's partitions succeed), except in the schedule's syncs, where a partition with
nothing new keeps its latest materialization; every load logs one observation of the asset (when it
was synced, how far behind the feed it is). The checks run in the same step, after the commit, on
the partitions it committed.
"""

import warnings

import dagster as dg

from feedapi_dagster.protocol.registry import protocol_of

from .checks import feed_check_results, feed_check_specs, recorded_user_deletes
from .maintenance import maintain_after_load
from .loads import (BACKFILL_TAG, REBUILD_TAG, SUCCEEDED, FeedBinding, active_partitions, failure,
                    latest_metadata_by_partition, listed_partitions, make_loader, materializations,
                    materialized_reports, mirror_repairs, sync_observation)


class LoadConfig(dg.Config):
    """Run configuration of a load. Empty: bring every due partition of the run's keys up to date."""

    rebuild: list[int] = []  # partitions to reload from `_first`, their rows replaced atomically
    drop: list[int] = []  # partitions whose rows go in the same commit (the vanished parent of a split)


def build_feed_asset(binding: FeedBinding, spec: dg.AssetSpec) -> dg.AssetsDefinition:
    with warnings.catch_warnings():
        # `backfill_policy` is beta in Dagster 1.13 and warns wherever the definitions load (every run's
        # log starts with it); this use of it is deliberate and tested (tests/orchestration)
        warnings.simplefilter("ignore", dg.BetaWarning)
        return _feed_asset(binding, spec)


def _feed_asset(binding: FeedBinding, spec: dg.AssetSpec) -> dg.AssetsDefinition:
    @dg.asset(
        key=spec.key,
        group_name=spec.group_name,
        kinds=spec.kinds,
        owners=spec.owners,
        tags=spec.tags,
        description=spec.description,
        metadata=spec.metadata,
        partitions_def=dg.DynamicPartitionsDefinition(name=binding.partitions_name),
        check_specs=feed_check_specs(spec.key, protocol_of(binding.feed.settings)),
        required_resource_keys={binding.spark_key},
        # one run may load many partitions: a backfill's contiguous keys become one range run
        backfill_policy=dg.BackfillPolicy.single_run(),
        # one load of a feed at a time (the instance sets the pool's limit; dagster.yaml ships 1)
        pool=f"feedapi_{binding.name}",
        # materializations are logged per partition (`load`), not one per key of the range
        output_required=False,
    )
    def feed_asset(context: dg.AssetExecutionContext, config: LoadConfig):
        yield from load(binding, context, config)

    return feed_asset


def load(binding: FeedBinding, context: dg.AssetExecutionContext, config: LoadConfig):
    keys = [int(key) for key in context.partition_keys]
    if (listed := listed_partitions(context.run.tags)) is not None:  # the sensor's and schedule's runs say which
        keys = [key for key in keys if key in listed]
    busy = active_partitions(context.instance, binding, exclude_run_id=context.run.run_id)
    if len(keys) == 1 and keys[0] in busy:
        raise dg.Failure(f"feed {binding.name} partition {keys[0]}: another run is loading it; not starting a "
                         "second load (see the runs tagged feedapi/feed)", allow_retries=False)
    wanted = [key for key in keys if key not in busy]
    if len(wanted) < len(keys):
        context.log.info("skipping partitions %s: other runs are loading them", sorted(set(keys) - set(wanted)))
    if clash := busy & {*config.rebuild, *config.drop}:
        raise dg.Failure(f"feed {binding.name}: partitions {sorted(clash)} are being loaded by another run")
    rebuild = set(config.rebuild) | (set(wanted) if context.run.tags.get(REBUILD_TAG) == "true" else set())
    outcome = make_loader(binding, context).load(
        wanted, rebuild=rebuild, drop=config.drop,
        # a backfill of a closed partition rebuilds it from `_first`
        rebuild_closed=BACKFILL_TAG in context.run.tags)
    for report in outcome.reports.values():
        if report.error and report.status not in SUCCEEDED:  # a waiting partition's reason is no error
            context.log.error("partition %s: %s", report.partition_id, report.error)
    # the checks look at the partitions this load committed something for
    loaded = [r.partition_id for r in outcome.reports.values() if r.status == "loaded" and r.delta_version is not None]
    # Dagster's view of every partition, read once (10,000 partitions: seconds): the mirror repairs and
    # the mirror check both start from it, and the check adds what this load logged
    mirrored = latest_metadata_by_partition(context.instance, binding,
                                            [str(p) for p in outcome.committed.state.partitions])
    events = materializations(binding, materialized_reports(context.run, outcome, wanted), outcome)
    for event in events:
        context.log_event(event)
    context.log_event(sync_observation(binding, outcome, context.log))
    for event in mirror_repairs(binding, outcome, mirrored, skip=[int(event.partition) for event in events]):
        context.log.info("partition %s: materialization metadata was behind Delta; recorded the cursor of record",
                         event.partition)
        context.log_event(event)
        events.append(event)
    mirrored.update({event.partition: {k: v.value for k, v in event.metadata.items()} for event in events})
    yield from feed_check_results(outcome, loaded, mirrored, protocol_of(binding.feed.settings),
                                  recorded_user_deletes(context.instance, binding.key))
    maintain_after_load(context, binding, outcome.table)
    if problem := failure(binding, outcome.reports.values()):
        raise problem
