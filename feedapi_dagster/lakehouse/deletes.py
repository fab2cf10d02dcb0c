"""Rows a user's DELETE removed from a feed table, per partition, from the Delta log.

A DELETE (Spark SQL's, delta-rs's `DeltaTable.delete`, e.g. a GDPR erasure) is a commit of its own
(operation `DELETE`) that removes the files holding the deleted rows and adds the rewritten ones.
The rows it removed from a partition are the partition's row count before it less the count after
it: exact whatever the predicate, whichever engine wrote it, and with no need for `stats` on the
remove actions (delta-rs writes none). How the counts are found depends on the table's layout
(`DeltaLog.partitioned`, from its metadata):

* a partitioned table (`PARTITIONED BY (partition_id)`, tables created by 0.1.0 and earlier): from the file
  statistics of the two versions (`numRecords` of each partition's files, no scan);
* a clustered table (`CLUSTER BY (partition_id)`), or one of no layout (`none`): a file holds rows of
  many partitions, so delta-rs reads the `partition_id` column of the files the DELETE removed (at the
  version before it) and of the files it added (at its version), and the partition's rows in the first
  less those in the second are what it removed (the files both versions hold are the same rows). Only
  the DELETE's own files are read, not the table; but they must still exist: a DELETE counted only after
  VACUUM deleted the files it removed (older than the retention, `time_travel_hours`; a count that
  starts from scratch on a new Dagster instance) cannot be counted, and the count is then not `exact`.

Those rows are no loss: the positions check (`positions_contiguous`) expects a
partition's rows to be its committed position less them. Rows that anything else removed (a data
file lost by a commit that is not a DELETE, an overwrite outside the loader) are not counted, and
still fail it.

The count of a partition starts again when a load rewrites the partition from its start (a
rebuild: the loader's overwrite of the partition; the partitions whose files it removed in a
partitioned table, those its commit's metadata names as `replaced` in a clustered one, where the
files it rewrote hold other partitions' rows too), and a RESTORE takes the count back to that of
the version it restores.

**Cost.** A count goes on from the previous one (`since`, which the check records in its result):
only the commits after it are read, and only a DELETE or a load's overwrite among them costs two
snapshots of the table (and, for a clustered table, a read of the `partition_id` column of the files
a DELETE rewrote). Without a previous count the whole log is read (a tenth of a second for 2,000
commits: `benchmarks/README.md`).

**Log cleanup.** Delta's log cleanup removes old commits (behind a checkpoint, after
`delta.logRetentionDuration`, 30 days by default). A count carried on from one load to the next
never needs them. When a count must start from a log that no longer reaches back to the table's
creation (no previous count: a new Dagster instance, or a RESTORE to a version before the previous
count), the DELETE commits before the log's oldest commit cannot be told from a loss: the count is
then not `exact`, and the check accepts fewer rows than the committed position minus the counted
deletions (more rows, or rows outside the positions, still fail) until a load rewrites the
partition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from feedapi_dagster.lakehouse.cursor_record import decode, replaced_partitions
from feedapi_dagster.lakehouse.delta_log import DELETE, DeltaLog, HistoryEntry
from feedapi_dagster.read.rows import PARTITION_COLUMN

# the write mode of a commit that replaced rows (a load's rebuild of partitions, `replaceWhere`)
_OVERWRITE = "Overwrite"


@dataclass(frozen=True)
class UserDeletes:
    """Rows DELETE commits removed from each partition since a load last wrote it from its start,
    counted up to table version `version`. `exact`: the count saw every commit that could have
    deleted rows; else exact only for the partitions in `rewritten` (a load rewrote them since)."""

    rows: Mapping[int, int]
    version: int
    exact: bool
    rewritten: frozenset[int] = field(default_factory=frozenset)

    def deleted(self, partition_id: int) -> int:
        return self.rows.get(partition_id, 0)

    def exact_for(self, partition_id: int) -> bool:
        return self.exact or partition_id in self.rewritten


@dataclass
class _Count:
    rows: dict[int, int]
    exact: bool
    rewritten: set[int]

    def copy(self) -> _Count:
        return _Count(dict(self.rows), self.exact, set(self.rewritten))


def count_user_deletes(log: DeltaLog, since: UserDeletes | None = None) -> UserDeletes:
    """The rows DELETE commits removed per partition, up to the table's newest version, going on
    from the count `since` where it is one of this table's."""
    head = log.version()
    if since is not None and since.version == head:
        return since
    if since is not None and since.version < head:
        entries = log.history(head - since.version)
        if entries and entries[-1].version == since.version + 1:
            counted = _walk(log, entries, _Count(dict(since.rows), since.exact, set(since.rewritten)), since.version)
            if counted is not None:
                return counted
    # no count to go on from (or one of another table at this path, or undone by a RESTORE)
    entries = log.history(None)
    start = entries[-1].version - 1 if entries else head
    counted = _walk(log, entries, _Count({}, exact=start < 0, rewritten=set()), start)
    if counted is None:  # a RESTORE to a version before the log's oldest commit
        counted = UserDeletes({}, head, exact=False)
    return counted


def _walk(log: DeltaLog, entries: list[HistoryEntry], count: _Count, start: int) -> UserDeletes | None:
    """`entries` (newest first) applied to `count`, the count at version `start`; None when a
    RESTORE in them goes back to before `start`."""
    counts_at = [(start, count.copy())]  # the count after each version that changed it, oldest first
    for entry in reversed(entries):
        if entry.restored_version is not None:
            earlier = [c for version, c in counts_at if version <= entry.restored_version]
            if not earlier:
                return None
            count = earlier[-1].copy()
        elif entry.operation == DELETE:
            _count_delete(log, entry.version, count)
        elif entry.parameters.get("mode") == _OVERWRITE and decode(entry.user_metadata, entry.version):
            _count_rewrite(log, entry, count)
        else:
            continue
        counts_at.append((entry.version, count.copy()))
    return UserDeletes(
        dict(count.rows), entries[0].version if entries else start, count.exact, frozenset(count.rewritten)
    )


def _count_delete(log: DeltaLog, version: int, count: _Count) -> None:
    try:
        removed = _removed_rows(log, version)
    except Exception:  # noqa: BLE001 - delta-rs raises many types; the version before is cleaned up
        count.exact = False  # what it deleted is not known
        return
    for partition, rows in removed.items():
        if rows > 0:
            count.rows[partition] = count.rows.get(partition, 0) + rows


def _removed_rows(log: DeltaLog, version: int) -> dict[int, int]:
    """Each partition's rows at the version before `version` less its rows at `version`."""
    before, after = log.snapshot_at(version - 1), log.snapshot_at(version)
    if log.partitioned():
        had, has = _rows(partition_files(before)), _rows(partition_files(after))
    else:  # clustered: the rows of the files the commit removed, less those of the files it added
        old, new = data_files(before), data_files(after)
        had = _counts(log.partition_columns(before, paths=old - new)) if old - new else {}
        has = _counts(log.partition_columns(after, paths=new - old)) if new - old else {}
    return {partition: rows - has.get(partition, 0) for partition, rows in had.items()}


def _count_rewrite(log: DeltaLog, entry: HistoryEntry, count: _Count) -> None:
    """A load's overwrite (a rebuild): the partitions it rewrote start again from 0."""
    try:
        if log.partitioned():  # the partitions whose files it removed
            before = partition_files(log.snapshot_at(entry.version - 1))
            after = partition_files(log.snapshot_at(entry.version))
            rewritten = {partition for partition, files in before.items() if set(files) - set(after.get(partition, {}))}
        else:  # a clustered table's files hold many partitions: the commit names those it replaced
            named = replaced_partitions(entry.user_metadata)
            if named is None:
                raise LookupError(f"commit {entry.version} does not name the partitions it replaced")
            rewritten = set(named)
    except Exception:  # noqa: BLE001 - see `_count_delete`
        count.exact = False  # which partitions it rewrote is not known
        return
    for partition in rewritten:
        count.rows.pop(partition, None)
    count.rewritten |= rewritten


def _rows(files: Mapping[int, dict[str, int]]) -> dict[int, int]:
    return {partition: sum(by_path.values()) for partition, by_path in files.items()}


def _counts(columns) -> dict[int, int]:  # noqa: ANN001 - a pyarrow Table
    """Rows per partition of a read of the `partition_id` column."""
    counted = columns[PARTITION_COLUMN].value_counts().to_pylist()
    return {int(c["values"]): c["counts"] for c in counted if c["values"] is not None}


# The table's files at a version, read by delta-rs: what only the count of DELETEs needs of the log


def partition_files(snapshot: Any) -> dict[int, dict[str, int]]:
    """Each partition's data files in a partitioned table's snapshot and their row counts."""
    import pyarrow as pa

    actions = pa.table(snapshot.get_add_actions(flatten=True)).to_pydict()
    files: dict[int, dict[str, int]] = {}
    for partition, path, rows in zip(
        actions.get(f"partition.{PARTITION_COLUMN}", ()), actions["path"], actions["num_records"], strict=True
    ):
        if partition is not None:
            files.setdefault(int(partition), {})[path] = rows
    return files


def data_files(snapshot: Any) -> set[str]:
    """The paths of a snapshot's data files, as its add actions (and its Arrow dataset's fragments) name them."""
    import pyarrow as pa

    return set(pa.table(snapshot.get_add_actions(flatten=True)).column("path").to_pylist())
