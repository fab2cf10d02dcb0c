"""Delta maintenance of a feed's table: when OPTIMIZE and VACUUM are due, and how long VACUUM keeps the
files the table no longer uses.

VACUUM deletes files that no current version references once they are older than its retention. Two
kinds of reader still need such files: a user time-travelling to an older version, and a load still
running, which reads (to deduplicate) the version it started from and writes data files that no
version references until it commits. The retention covers both: never below the time-travel window,
never below the age of the oldest running load plus a margin.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from feedapi_dagster.lakehouse.delta_log import FILE_MAINTENANCE, OPTIMIZE, VACUUM_END, VACUUM_START, HistoryEntry
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.spark.watchdog import DEFAULT_UNRESPONSIVE_SECONDS, answering

# what `maintain` runs (OPTIMIZE is also the operation's name in the Delta log; VACUUM logs two)
VACUUM = "VACUUM"
# a running load's start is known to the second or so, its Spark work goes on a little after it
# reports; an hour more never hurts
RUNNING_LOAD_MARGIN_HOURS = 1.0

# commits that add or replace no rows: not counted towards the next OPTIMIZE or VACUUM
_NOT_COUNTED = FILE_MAINTENANCE | {"CREATE TABLE", "SET TBLPROPERTIES"}


class MaintenanceSettings(BaseModel):
    """Delta maintenance of a feed's table: OPTIMIZE (bin-packs the many small files that frequent
    loads make) and VACUUM (deletes the files no version in the time-travel window uses), after the
    loads' commits and, with `cron`, on a schedule of its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    optimize_every_commits: int | None = Field(
        default=50,
        ge=1,
        description="OPTIMIZE after a load once this many commits were made since the last OPTIMIZE; "
        "null: never after loads (only on the `cron` schedule)",
    )
    vacuum_every_commits: int | None = Field(
        default=200,
        ge=1,
        description="VACUUM after a load once this many commits were made since the last VACUUM; "
        "null: never after loads (only on the `cron` schedule)",
    )
    time_travel_hours: float = Field(
        default=168,
        ge=0,
        description="how far back the table's versions stay readable (time travel): VACUUM never deletes "
        "files a version of the last `time_travel_hours` uses, nor files a running load may "
        "still read. Rounded up to whole hours (Delta's VACUUM counts whole hours). This "
        "replaces Delta's own `delta.deletedFileRetentionDuration` table property, which is "
        "ignored (VACUUM is given this retention explicitly)",
    )
    vacuum_listing_parallelism: int = Field(
        default=32,
        ge=1,
        description="Spark tasks that list the table's files for VACUUM (Spark's default, 10,000, "
        "makes a VACUUM of a small table take tens of seconds); raise it for tables of "
        "many thousands of partitions on a large cluster",
    )
    cron: str | None = Field(
        default=None,
        description='a schedule of its own for OPTIMIZE and VACUUM, e.g. "0 3 * * *" (null: none; '
        "maintenance then runs only after loads)",
    )


@dataclass(frozen=True)
class MaintenanceReport:
    """What one maintenance did to the table."""

    operations: tuple[str, ...]  # "OPTIMIZE", "VACUUM", in the order they ran
    retention_hours: float | None  # the retention VACUUM was given (None: no VACUUM)
    files_removed: int | None  # files VACUUM deleted (None: no VACUUM, or not known)
    delta_version: int | None  # the table's version after the maintenance

    def __str__(self) -> str:
        parts = []
        if OPTIMIZE in self.operations:
            parts.append(OPTIMIZE)
        if VACUUM in self.operations:
            removed = "unknown" if self.files_removed is None else self.files_removed
            parts.append(f"VACUUM retaining {self.retention_hours:g} h ({removed} files removed)")
        return (", ".join(parts) or "no maintenance") + f"; table version {self.delta_version}"


def vacuum_retention_hours(
    settings: MaintenanceSettings, oldest_running_load: dt.datetime | None, now: dt.datetime | None = None
) -> float:
    """The retention VACUUM must be given: the time-travel window, or longer while a load that started
    at `oldest_running_load` runs (it reads the version it started from, and its files are not
    committed yet). Whole hours, rounded up: Delta rounds `RETAIN n HOURS` to the nearest hour, which
    could otherwise cut half an hour off. A naive datetime is taken as UTC."""
    hours = settings.time_travel_hours
    if oldest_running_load is not None:
        now = _aware(now or dt.datetime.now(dt.UTC))
        running = max(0.0, (now - _aware(oldest_running_load)).total_seconds() / 3600)
        hours = max(hours, running + RUNNING_LOAD_MARGIN_HOURS)
    return float(math.ceil(hours))


def commits_since(entries: Iterable[HistoryEntry], operations: Iterable[str]) -> int:
    """Commits that added or replaced rows since the newest of `operations`, from history entries
    newest first (all of them when none of `operations` is among the entries)."""
    stop = set(operations)
    count = 0
    for entry in entries:
        if entry.operation in stop:
            break
        # a state commit, or a quiet sync's, adds no row (its write's `numOutputRows` is 0)
        if entry.operation not in _NOT_COUNTED and entry.metrics.get("numOutputRows") != "0":
            count += 1
    return count


def _aware(moment: dt.datetime) -> dt.datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def due(
    table: FeedTable, settings: MaintenanceSettings, *, unresponsive_seconds: float = DEFAULT_UNRESPONSIVE_SECONDS
) -> tuple[str, ...]:
    """What the loads' commits made due: OPTIMIZE after `optimize_every_commits` commits since the
    last OPTIMIZE, VACUUM after `vacuum_every_commits` since the last VACUUM. The history is read
    through Spark where delta-rs cannot read the log: a Spark Connect server silent for
    `unresponsive_seconds` ends it (`answering`)."""
    thresholds = {OPTIMIZE: settings.optimize_every_commits, VACUUM: settings.vacuum_every_commits}
    wanted = {operation: every for operation, every in thresholds.items() if every is not None}
    if not wanted:
        return ()
    # maintenance's own commits and the loads' state commits are not counted: twice the largest
    # threshold, and a few more entries
    with answering(table.spark, f"maintenance of {table.path}", unresponsive_seconds=unresponsive_seconds):
        entries = table.history(2 * max(wanted.values()) + 8)
    stops = {OPTIMIZE: (OPTIMIZE,), VACUUM: (VACUUM_START, VACUUM_END)}
    return tuple(operation for operation, every in wanted.items() if commits_since(entries, stops[operation]) >= every)


def maintain(
    table: FeedTable,
    settings: MaintenanceSettings,
    oldest_running_load: dt.datetime | None,
    operations: Iterable[str] = (OPTIMIZE, VACUUM),
    *,
    unresponsive_seconds: float = DEFAULT_UNRESPONSIVE_SECONDS,
) -> MaintenanceReport:
    """OPTIMIZE, then VACUUM with the retention `vacuum_retention_hours` gives, by Spark. Neither moves
    a cursor: OPTIMIZE rewrites files without changing rows, VACUUM deletes files no version in the
    retention uses. A Spark Connect server silent for `unresponsive_seconds` ends it (`answering`)."""
    operations = tuple(operations)
    retention = removed = None
    with answering(table.spark, f"maintenance of {table.path}", unresponsive_seconds=unresponsive_seconds):
        if OPTIMIZE in operations:
            table.optimize()
        if VACUUM in operations:
            retention = vacuum_retention_hours(settings, oldest_running_load)
            table.vacuum(retention, settings.vacuum_listing_parallelism)
        after = table.history(8)
    if retention is not None:
        end = next((e for e in after if e.operation == VACUUM_END), None)
        if end is not None and "numDeletedFiles" in end.metrics:
            removed = int(end.metrics["numDeletedFiles"])
    return MaintenanceReport(operations, retention, removed, after[0].version if after else None)
