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
(`FeedProtocol.reports_retention_gaps`), since elsewhere it could never fail. And, for a variant feed
or columns feed (`payload_form: variant | columns`), that Spark parsed every payload the load committed
(one it could not is loaded with `data` NULL, its text in `payload`) and that every value of a columns
feed landed in its typed column (not in `_rescued_data`), counted by the write job; the check warns, so
that a producer whose payloads drift is noticed.
The first two block: a violation means wrong rows.

A check is one function of the `CheckedLoad` registered by `@feed_check` (its name, its description,
whether it blocks, which feeds it applies to); `feed_check_specs` and `feed_check_results` go
through the registry, and each check's metadata is a typed set (`metadata.MetadataSet`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Self

import dagster as dg

from feedapi_dagster.lakehouse.deletes import UserDeletes, count_user_deletes
from feedapi_dagster.lakehouse.load_report import LoadOutcome
from feedapi_dagster.lakehouse.stats import NO_ROWS, duplicate_event_ids, partition_stats
from feedapi_dagster.protocol.registry import protocol_of

from .config import FeedConfig
from .metadata import MetadataSet, PartitionMetadata

NO_DUPLICATES = "no_duplicate_event_ids"
CONTIGUOUS = "positions_contiguous"
CURSOR_MIRRORED = "cursor_metadata_matches_delta"
NO_RETENTION_GAP = "no_events_expired_unread"
PAYLOADS_PARSED = "payloads_parsed"
_SHOWN = 20


@dataclass(frozen=True)
class CheckedLoad:
    """What the checks look at: the load's outcome, the partitions it committed something for
    (`loaded`), each partition's latest materialization by partition key (Dagster's, as the load found
    it, plus what it logged), and the previous positions check's count of users' DELETEs."""

    outcome: LoadOutcome
    loaded: Sequence[int]
    mirrored: Mapping[str, PartitionMetadata]
    deletes_before: UserDeletes | None


Evaluate = Callable[[CheckedLoad], dg.AssetCheckResult]


@dataclass(frozen=True)
class FeedCheck:
    name: str
    description: str
    evaluate: Evaluate
    blocking: bool
    applies: Callable[[FeedConfig], bool]  # registered only for the feeds it can fail for

    def spec(self, key: dg.AssetKey) -> dg.AssetCheckSpec:
        return dg.AssetCheckSpec(self.name, asset=key, blocking=self.blocking, description=self.description)


# every check of a feed's asset, in the order they run, by name (`@feed_check`)
FEED_CHECKS: dict[str, FeedCheck] = {}


def _always(feed: FeedConfig) -> bool:
    return True


def feed_check(
    name: str, description: str, *, blocking: bool = False, applies: Callable[[FeedConfig], bool] = _always
) -> Callable[[Evaluate], Evaluate]:
    """Registers the decorated function as the check `name` of every feed asset (of the feeds it
    `applies` to)."""

    def register(evaluate: Evaluate) -> Evaluate:
        FEED_CHECKS[name] = FeedCheck(name, description, evaluate, blocking, applies)
        return evaluate

    return register


def feed_check_specs(key: dg.AssetKey, feed: FeedConfig) -> list[dg.AssetCheckSpec]:
    """The checks of a feed's asset: those it can fail."""
    return [check.spec(key) for check in FEED_CHECKS.values() if check.applies(feed)]


def feed_check_results(load: CheckedLoad, selected: set[str]) -> Iterator[dg.AssetCheckResult]:
    """The results of the checks named in `selected` (the step's checks)."""
    for check in FEED_CHECKS.values():
        if check.name in selected:
            yield check.evaluate(load)


class PositionsChecked(MetadataSet):
    """The positions check's result, and its count of users' DELETEs, which the next load goes on
    from (`recorded_user_deletes`)."""

    partitions_checked: int
    problems: list[str]
    deleted_by_user: dict[str, int] | None = None
    deletes_counted_to_version: int | None = None
    deletes_exact: bool | None = None
    # DELETEs before the log's oldest commit are unknown: fewer rows than expected are accepted, except
    # in these partitions (rebuilt by a load since)
    deletes_exact_after_rebuild: list[int] | None = None

    @classmethod
    def of(cls, loaded: Sequence[int], broken: Sequence[str], deletes: UserDeletes | None) -> Self:
        if deletes is None:
            return cls(partitions_checked=len(loaded), problems=list(broken[:_SHOWN]))
        return cls(
            partitions_checked=len(loaded),
            problems=list(broken[:_SHOWN]),
            deleted_by_user={str(p): rows for p, rows in sorted(deletes.rows.items())},
            deletes_counted_to_version=deletes.version,
            deletes_exact=deletes.exact,
            deletes_exact_after_rebuild=None if deletes.exact else sorted(deletes.rewritten),
        )

    def user_deletes(self) -> UserDeletes | None:
        if self.deletes_counted_to_version is None or self.deleted_by_user is None or self.deletes_exact is None:
            return None
        return UserDeletes(
            {int(p): rows for p, rows in self.deleted_by_user.items()},
            self.deletes_counted_to_version,
            self.deletes_exact,
            frozenset(self.deletes_exact_after_rebuild or ()),
        )


@feed_check(
    CONTIGUOUS,
    "Positions of each loaded partition are 0..n-1 and n is its committed position, less the rows a "
    "user's DELETE removed (Delta file statistics and log).",
    blocking=True,
)
def positions_contiguous(load: CheckedLoad) -> dg.AssetCheckResult:
    table = load.outcome.table
    state = load.outcome.committed.state
    stats = partition_stats(table, load.loaded)
    # where only the cluster reaches the table (no delta-rs log here), no DELETE is counted
    deletes = count_user_deletes(table.delta_log, load.deletes_before) if table.delta_log is not None else None
    broken = []
    for partition_id in sorted(load.loaded):
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
    checked = PositionsChecked.of(load.loaded, broken, deletes)
    return dg.AssetCheckResult(check_name=CONTIGUOUS, passed=not broken, metadata=checked.metadata())


class DuplicatesChecked(MetadataSet):
    partitions_checked: int
    examples: list[str]
    rows_checked: str


@feed_check(NO_DUPLICATES, "No event id is stored twice in a loaded partition.", blocking=True)
def no_duplicate_event_ids(load: CheckedLoad) -> dg.AssetCheckResult:
    # An exactly-once feed's ids are unique in the feed, and the positions check says each row the load
    # added was written once: the read tasks saw every id it added and counted those the feed sent
    # twice (no scan). An at-least-once feed's whole partitions are scanned, since the load
    # deduplicated against them.
    if load.outcome.info.exactly_once:
        duplicates = [
            f"partition {pid}: {report.repeated_ids} event id(s) sent more than once, e.g. "
            f"{', '.join(report.repeated_examples)}"
            for pid, report in sorted(load.outcome.reports.items())
            if report.repeated_ids
        ]
        rows_checked = "the rows this load added, as its read tasks saw them"
    else:
        duplicates = duplicate_event_ids(load.outcome.table, load.loaded, limit=_SHOWN)
        rows_checked = "every row of the loaded partitions"
    checked = DuplicatesChecked(
        partitions_checked=len(load.loaded), examples=duplicates[:_SHOWN], rows_checked=rows_checked
    )
    return dg.AssetCheckResult(check_name=NO_DUPLICATES, passed=not duplicates, metadata=checked.metadata())


class CursorsChecked(MetadataSet):
    problems: list[str]


@feed_check(CURSOR_MIRRORED, "The cursor in each partition's latest materialization is the one in Delta.")
def cursor_metadata_matches_delta(load: CheckedLoad) -> dg.AssetCheckResult:
    mismatched = [
        f"partition {pid}: metadata {mirrored.cursor!r}, Delta {committed.cursor!r}"
        for pid, committed in sorted(load.outcome.committed.state.partitions.items())
        if (mirrored := load.mirrored.get(str(pid))) is not None and mirrored.cursor != committed.cursor
    ]
    checked = CursorsChecked(problems=mismatched[:_SHOWN])
    return dg.AssetCheckResult(check_name=CURSOR_MIRRORED, passed=not mismatched, metadata=checked.metadata())


class GapsChecked(MetadataSet):
    gaps: list[str]


@feed_check(
    NO_RETENTION_GAP,
    "No events of a loaded partition expired on the server (its retention) after the partition's "
    "cursor before they were read.",
    applies=lambda feed: protocol_of(feed.settings).reports_retention_gaps,
)
def no_events_expired_unread(load: CheckedLoad) -> dg.AssetCheckResult:
    gaps = [report.gap for report in load.outcome.reports.values() if report.gap]
    return dg.AssetCheckResult(
        check_name=NO_RETENTION_GAP,
        passed=not gaps,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata=GapsChecked(gaps=gaps[:_SHOWN]).metadata(),
    )


class PayloadsChecked(MetadataSet):
    """The partitions the load committed rows to whose payloads Spark could not parse, and how many
    each; of a columns feed, those with rows whose values went to `_rescued_data`; those whose counts
    Spark did not report."""

    unparsed_payloads: dict[str, int]
    rescued_values: dict[str, int] | None = None
    partitions_checked: int
    not_counted: list[int] | None = None


@feed_check(
    PAYLOADS_PARSED,
    "Spark parsed every payload the load committed (a payload it cannot parse is loaded with `data` NULL, "
    "or no typed column, and its text in `payload`) and, for payload_form: columns, every value landed in "
    "its typed column (a value with no column or that does not fit it is kept in `_rescued_data`: WHERE "
    "_rescued_data IS NOT NULL); counted per partition by the load's write job.",
    applies=lambda feed: feed.payload_form in ("variant", "columns"),
)
def payloads_parsed(load: CheckedLoad) -> dg.AssetCheckResult:
    reports = [load.outcome.reports[pid] for pid in sorted(load.loaded) if pid in load.outcome.reports]
    unparsed = {str(r.partition_id): r.unparsed_payloads for r in reports if r.unparsed_payloads}
    columns = load.outcome.table.form == "columns"
    rescued = {str(r.partition_id): r.rescued_values for r in reports if r.rescued_values}
    not_counted = [
        r.partition_id for r in reports if r.unparsed_payloads is None or (columns and r.rescued_values is None)
    ]
    checked = PayloadsChecked(
        unparsed_payloads=unparsed,
        rescued_values=rescued if columns else None,
        partitions_checked=len(reports),
        not_counted=not_counted or None,
    )
    return dg.AssetCheckResult(
        check_name=PAYLOADS_PARSED,
        passed=not unparsed and not rescued and not not_counted,
        severity=dg.AssetCheckSeverity.WARN,
        metadata=checked.metadata(),
    )
