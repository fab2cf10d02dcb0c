"""Checks of a feed table, run in every load's step right after its commit.

What exactly-once means, verified on the data the load just committed: positions of each loaded
partition are 0..n-1 with n its committed position, but for the rows a user's DELETE removed (from
the Delta log's file statistics in a table partitioned by partition_id, from a delta-rs read of the
columns partition_id and position in a clustered one; `lakehouse/stats.py`, `lakehouse/deletes.py`),
no event id is stored twice in it (where the feed's ids are unique, the load's read tasks count the
ids it sent twice among the rows they read; otherwise a scan of those partitions' id column), and the cursor
in every partition's latest materialization is the one in Delta (the log, and Dagster's event log as
the load found it plus what it logged). And no events were lost to the server's retention before
they were read (Nakadi deletes old events whether they were read or not): the check names each
partition and the offsets between which events are gone (`load.retention_gap` says what the load
does then); it is registered only where the protocol reports such gaps
(`FeedProtocol.reports_retention_gaps`), since elsewhere it could never fail.
The first two block: a violation means wrong rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import dagster as dg
from dagster._core.definitions.metadata import RawMetadataValue  # not exported by dagster (see loads.py)
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from feedapi_dagster.lakehouse.deletes import UserDeletes, count_user_deletes
from feedapi_dagster.lakehouse.load_report import LoadOutcome
from feedapi_dagster.lakehouse.stats import NO_ROWS, duplicate_event_ids, partition_stats
from feedapi_dagster.protocol.interface import FeedProtocol

NO_DUPLICATES = "no_duplicate_event_ids"
CONTIGUOUS = "positions_contiguous"
CURSOR_MIRRORED = "cursor_metadata_matches_delta"
NO_RETENTION_GAP = "no_events_expired_unread"
_SHOWN = 20
# the positions check's record of the rows users' DELETEs removed, carried from one load to the next
_DELETED = "deleted_by_user"
_DELETES_VERSION = "deletes_counted_to_version"
_DELETES_EXACT = "deletes_exact"
_DELETES_REWRITTEN = "deletes_exact_after_rebuild"


def feed_check_specs(key: dg.AssetKey, protocol: FeedProtocol) -> list[dg.AssetCheckSpec]:
    """The checks of a feed's asset: those its protocol can fail."""
    specs = [
        dg.AssetCheckSpec(
            CONTIGUOUS,
            asset=key,
            blocking=True,
            description="Positions of each loaded partition are 0..n-1 and n is its committed "
            "position, less the rows a user's DELETE removed (Delta file statistics "
            "and log).",
        ),
        dg.AssetCheckSpec(
            NO_DUPLICATES, asset=key, blocking=True, description="No event id is stored twice in a loaded partition."
        ),
        dg.AssetCheckSpec(
            CURSOR_MIRRORED,
            asset=key,
            description="The cursor in each partition's latest materialization is the one in Delta.",
        ),
    ]
    if protocol.reports_retention_gaps:
        specs.append(
            dg.AssetCheckSpec(
                NO_RETENTION_GAP,
                asset=key,
                description="No events of a loaded partition expired on the server (its "
                "retention) after the partition's cursor before they were read.",
            )
        )
    return specs


def recorded_user_deletes(instance: dg.DagsterInstance, key: dg.AssetKey) -> UserDeletes | None:
    """The count of users' DELETEs the feed's latest positions check recorded (None: none did)."""
    # DagsterInstance has no public read of a check's latest evaluation with its metadata; this storage
    # method (and its status enum, imported from dagster._core) is what the UI's check history uses
    evaluated = {AssetCheckExecutionRecordStatus.SUCCEEDED, AssetCheckExecutionRecordStatus.FAILED}
    records = instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(key, CONTIGUOUS), limit=1, status=evaluated
    )
    event = records[0].event.dagster_event if records and records[0].event else None
    # a SUCCEEDED or FAILED record's event is the check's evaluation (the record's constructor asserts it)
    metadata = event.asset_check_evaluation_data.metadata if event else {}
    if _DELETES_VERSION not in metadata:
        return None
    deleted = metadata[_DELETED]
    rewritten = metadata.get(_DELETES_REWRITTEN, dg.MetadataValue.json([]))
    version = metadata[_DELETES_VERSION].value
    exact = metadata[_DELETES_EXACT].value
    # as `_contiguous` records them: rows by partition and the rebuilt partitions as JSON, an int, a bool
    assert isinstance(deleted, dg.JsonMetadataValue) and isinstance(deleted.value, Mapping)
    assert isinstance(rewritten, dg.JsonMetadataValue) and isinstance(rewritten.value, Sequence)
    assert isinstance(version, int) and isinstance(exact, bool)
    return UserDeletes(
        {int(p): rows for p, rows in deleted.value.items()},
        version,
        exact,
        frozenset(rewritten.value),
    )


def feed_check_results(
    outcome: LoadOutcome,
    loaded: Sequence[int],
    latest: dict[str, dict],
    protocol: FeedProtocol,
    deletes_before: UserDeletes | None,
) -> Iterator[dg.AssetCheckResult]:
    """The results of `feed_check_specs`. `latest`: each partition's latest materialization metadata,
    by partition key; `deletes_before`: the previous positions check's count of users' DELETEs."""
    yield _contiguous(outcome, loaded, deletes_before)
    yield from _other_results(outcome, loaded, latest, protocol)


def _contiguous(outcome: LoadOutcome, loaded: Sequence[int], deletes_before: UserDeletes | None) -> dg.AssetCheckResult:
    table = outcome.table
    state = outcome.committed.state
    stats = partition_stats(table, loaded)
    # where only the cluster reaches the table (no delta-rs log here), no DELETE is counted
    deletes = count_user_deletes(table.delta_log, deletes_before) if table.delta_log is not None else None
    broken = []
    for partition_id in sorted(loaded):
        committed = state.get(partition_id)
        position = committed.position if committed else 0
        found = stats.get(partition_id, NO_ROWS)
        deleted = deletes.deleted(partition_id) if deletes else 0
        if not found.contiguous(position, deleted, deletes.exact_for(partition_id) if deletes else True):
            broken.append(
                f"partition {partition_id}: {found.rows} rows at positions "
                f"{found.min_position}..{found.max_position}, committed position {position}"
                + (f", {deleted} row(s) removed by DELETE commits" if deleted else "")
            )
    metadata: dict[str, RawMetadataValue] = {"partitions_checked": len(loaded), "problems": broken[:_SHOWN]}
    if deletes is not None:
        metadata.update(
            {
                _DELETED: dg.MetadataValue.json({str(p): rows for p, rows in sorted(deletes.rows.items())}),
                _DELETES_VERSION: deletes.version,
                _DELETES_EXACT: deletes.exact,
            }
        )
        if not deletes.exact:
            # DELETEs before the log's oldest commit are unknown: fewer rows than expected are accepted,
            # except in these partitions (rebuilt by a load since)
            metadata[_DELETES_REWRITTEN] = dg.MetadataValue.json(sorted(deletes.rewritten))
    return dg.AssetCheckResult(check_name=CONTIGUOUS, passed=not broken, metadata=metadata)


def _other_results(
    outcome: LoadOutcome, loaded: Sequence[int], latest: dict[str, dict], protocol: FeedProtocol
) -> Iterator[dg.AssetCheckResult]:
    table = outcome.table
    state = outcome.committed.state

    # An exactly-once feed's ids are unique in the feed, and the positions above say each row the load
    # added was written once: the read tasks saw every id it added and counted those the feed sent
    # twice (no scan). An at-least-once feed's whole partitions are scanned, since the load
    # deduplicated against them.
    if outcome.info.exactly_once:
        duplicates = [
            f"partition {pid}: {report.repeated_ids} event id(s) sent more than once, e.g. "
            f"{', '.join(report.repeated_examples)}"
            for pid, report in sorted(outcome.reports.items())
            if report.repeated_ids
        ]
        checked = "the rows this load added, as its read tasks saw them"
    else:
        duplicates = duplicate_event_ids(table, loaded, limit=_SHOWN)
        checked = "every row of the loaded partitions"
    yield dg.AssetCheckResult(
        check_name=NO_DUPLICATES,
        passed=not duplicates,
        metadata={"partitions_checked": len(loaded), "examples": duplicates[:_SHOWN], "rows_checked": checked},
    )

    mismatched = [
        f"partition {pid}: metadata {latest[str(pid)].get('cursor')!r}, Delta {committed.cursor!r}"
        for pid, committed in sorted(state.partitions.items())
        if str(pid) in latest and latest[str(pid)].get("cursor") != committed.cursor
    ]
    yield dg.AssetCheckResult(
        check_name=CURSOR_MIRRORED, passed=not mismatched, metadata={"problems": mismatched[:_SHOWN]}
    )

    if not protocol.reports_retention_gaps:
        return
    gaps = [report.gap for report in outcome.reports.values() if report.gap]
    yield dg.AssetCheckResult(
        check_name=NO_RETENTION_GAP,
        passed=not gaps,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"gaps": gaps[:_SHOWN]},
    )
