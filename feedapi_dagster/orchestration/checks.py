"""Asset checks of a feed table: what exactly-once means, verified on the data."""

import dagster as dg

from feedapi_dagster.lakehouse.state import read_committed_state

from .config import FeedConfig, ProjectConfig
from .loads import asset_key, feed_table, latest_metadata_by_partition
from .resources import SparkResource

NO_DUPLICATES = "no_duplicate_event_ids"
CONTIGUOUS = "positions_contiguous"
CURSOR_MIRRORED = "cursor_metadata_matches_delta"


def build_feed_checks(project: ProjectConfig, feed: FeedConfig) -> dg.AssetChecksDefinition:
    key = asset_key(feed)
    path = project.table_path(feed)

    @dg.multi_asset_check(
        name=f"feedapi_{feed.name}_checks",
        specs=[
            dg.AssetCheckSpec(NO_DUPLICATES, asset=key, description="No event id is stored twice in a partition."),
            dg.AssetCheckSpec(CONTIGUOUS, asset=key,
                              description="Positions of each partition are 0..n-1 and n is the committed position."),
            dg.AssetCheckSpec(CURSOR_MIRRORED, asset=key,
                              description="The cursor in each partition's latest materialization is the one in Delta."),
        ],
    )
    def feed_checks(context: dg.AssetCheckExecutionContext, spark: SparkResource):
        session = spark.session()
        duplicates = session.sql(
            f"SELECT partition_id, event_id, count(*) AS copies FROM delta.`{path}` WHERE event_id IS NOT NULL "
            "GROUP BY partition_id, event_id HAVING count(*) > 1 ORDER BY partition_id LIMIT 20").collect()
        yield dg.AssetCheckResult(
            check_name=NO_DUPLICATES, passed=not duplicates,
            metadata={"examples": [f"partition {r.partition_id}: {r.event_id} x{r.copies}" for r in duplicates]})

        state = read_committed_state(feed_table(project, feed, spark)).state
        shape = session.sql(
            f"SELECT partition_id, count(*) AS n, min(position) AS lo, max(position) AS hi, "
            f"count(DISTINCT position) AS distinct_positions FROM delta.`{path}` GROUP BY partition_id").collect()
        counts = {r.partition_id: r for r in shape}
        broken = []
        for partition_id in sorted({*counts, *state.partitions}):
            row, committed = counts.get(partition_id), state.get(partition_id)
            n = row.n if row else 0
            whole = row is None or (row.lo == 0 and row.hi == n - 1 and row.distinct_positions == n)
            if not whole or (committed is not None and committed.position != n):
                broken.append(f"partition {partition_id}: {n} rows, committed position "
                              f"{committed.position if committed else None}")
        yield dg.AssetCheckResult(check_name=CONTIGUOUS, passed=not broken, metadata={"problems": broken[:20]})

        mismatched = []
        latest = latest_metadata_by_partition(context.instance, feed, [str(p) for p in state.partitions])
        for partition_id, committed in sorted(state.partitions.items()):
            mirrored = latest.get(str(partition_id))
            if mirrored and mirrored.get("cursor") != committed.cursor:
                mismatched.append(f"partition {partition_id}: metadata {mirrored.get('cursor')!r}, "
                                  f"Delta {committed.cursor!r}")
        yield dg.AssetCheckResult(check_name=CURSOR_MIRRORED, passed=not mismatched,
                                  metadata={"problems": mismatched[:20]})

    return feed_checks
