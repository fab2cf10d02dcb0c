"""Checks of a feed table, run in every load's step right after its commit.

What exactly-once means, verified on the data the load just committed: positions of each loaded
partition are 0..n-1 with n its committed position (from the Delta log's file statistics, no scan),
no event id is stored twice in it (where the feed's ids are unique, the load's read tasks count the
ids it sent twice among the rows they read; otherwise a scan of those partitions' id column), and the cursor
in every partition's latest materialization is the one in Delta (the log, and Dagster's event log as
the load found it plus what it logged). And no events were lost to the server's retention before
they were read (Nakadi deletes old events whether they were read or not): the check names each
partition and the offsets between which events are gone (`load.retention_gap` says what the load
does then).
The first two block: a violation means wrong rows.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import dagster as dg

from feedapi_dagster.lakehouse.loader import LoadOutcome
from feedapi_dagster.lakehouse.stats import duplicate_event_ids, partition_stats


NO_DUPLICATES = "no_duplicate_event_ids"
CONTIGUOUS = "positions_contiguous"
CURSOR_MIRRORED = "cursor_metadata_matches_delta"
NO_RETENTION_GAP = "no_events_expired_unread"
_SHOWN = 20


def feed_check_specs(key: dg.AssetKey) -> list[dg.AssetCheckSpec]:
    return [
        dg.AssetCheckSpec(CONTIGUOUS, asset=key, blocking=True,
                          description="Positions of each loaded partition are 0..n-1 and n is its committed "
                                      "position (Delta file statistics)."),
        dg.AssetCheckSpec(NO_DUPLICATES, asset=key, blocking=True,
                          description="No event id is stored twice in a loaded partition."),
        dg.AssetCheckSpec(CURSOR_MIRRORED, asset=key,
                          description="The cursor in each partition's latest materialization is the one in Delta."),
        dg.AssetCheckSpec(NO_RETENTION_GAP, asset=key,
                          description="No events of a loaded partition expired on the server (its retention) "
                                      "after the partition's cursor before they were read."),
    ]


def feed_check_results(outcome: LoadOutcome, loaded: Sequence[int],
                       latest: dict[str, dict]) -> Iterator[dg.AssetCheckResult]:
    """`latest`: each partition's latest materialization metadata, by partition key."""
    table = outcome.table
    state = outcome.committed.state
    stats = partition_stats(table, loaded)
    broken = []
    for partition_id in sorted(loaded):
        committed = state.get(partition_id)
        position = committed.position if committed else 0
        found = stats.get(partition_id)
        if not (found.contiguous(position) if found else position == 0):
            broken.append(f"partition {partition_id}: {found.rows if found else 0} rows at positions "
                          f"{found.min_position if found else None}..{found.max_position if found else None}, "
                          f"committed position {position}")
    yield dg.AssetCheckResult(check_name=CONTIGUOUS, passed=not broken,
                              metadata={"partitions_checked": len(loaded), "problems": broken[:_SHOWN]})

    # An exactly-once feed's ids are unique in the feed, and the positions above say each row the load
    # added was written once: the read tasks saw every id it added and counted those the feed sent
    # twice (no scan). An at-least-once feed's whole partitions are scanned, since the load
    # deduplicated against them.
    if outcome.info.exactly_once:
        duplicates = [f"partition {pid}: {report.repeated_ids} event id(s) sent more than once, e.g. "
                      f"{', '.join(report.repeated_examples)}"
                      for pid, report in sorted(outcome.reports.items()) if report.repeated_ids]
        checked = "the rows this load added, as its read tasks saw them"
    else:
        duplicates = duplicate_event_ids(table, loaded, limit=_SHOWN)
        checked = "every row of the loaded partitions"
    yield dg.AssetCheckResult(check_name=NO_DUPLICATES, passed=not duplicates,
                              metadata={"partitions_checked": len(loaded), "examples": duplicates[:_SHOWN],
                                        "rows_checked": checked})

    mismatched = [f"partition {pid}: metadata {latest[str(pid)].get('cursor')!r}, Delta {committed.cursor!r}"
                  for pid, committed in sorted(state.partitions.items())
                  if str(pid) in latest and latest[str(pid)].get("cursor") != committed.cursor]
    yield dg.AssetCheckResult(check_name=CURSOR_MIRRORED, passed=not mismatched,
                              metadata={"problems": mismatched[:_SHOWN]})

    gaps = [report.gap for report in outcome.reports.values() if report.gap]
    yield dg.AssetCheckResult(check_name=NO_RETENTION_GAP, passed=not gaps,
                              severity=dg.AssetCheckSeverity.ERROR,
                              metadata={"gaps": gaps[:_SHOWN]})
