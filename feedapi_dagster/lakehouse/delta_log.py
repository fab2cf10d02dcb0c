"""A Delta table's log as delta-rs reads it in the run's process: its commits (with the feed state
each carries), its data files and their statistics, the table's layout.

The log is small and read often (before and after every commit): `DeltaLog` reads it in milliseconds
where the run process can open the table; where only the cluster reaches the storage, `FeedTable`
reads it through Spark (`DESCRIBE HISTORY`, 0.3-0.4 s) into the same `HistoryEntry`s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from feedapi_dagster.errors import StorageError
from feedapi_dagster.read.rows import PARTITION_COLUMN

if TYPE_CHECKING:
    import pyarrow as pa

# How a feed's table lays out its rows by the feed's partition (the feed's `layout` setting):
# * `clustered`: liquid clustering, `CLUSTER BY (partition_id)`, the default for a new table. A first load
#   of thousands of small partitions writes a file per read task, not a folder per partition (2,000
#   partitions: ~1 s against 20-28 s; `benchmarks/README.md`, issue #26); OPTIMIZE lays the files out by
#   `partition_id`. Writer features `clustering` and `domainMetadata`: delta-rs 1.6 (and so polars'
#   `write_delta`) refuses to write it, an operator's DELETE/RESTORE/OPTIMIZE goes through Spark SQL.
# * `partitioned`: a folder per feed partition, `PARTITIONED BY (partition_id)` (what 0.1.0 and earlier
#   created): delta-rs writes it; a first load costs a file per partition.
# * `none`: neither: written as a clustered table is (a file per read task), OPTIMIZE bin-packs; delta-rs
#   writes it.
# Every reader here tells them apart by the table's metadata (`DeltaLog.partitioned`), and a table's
# layout never changes in place (`LayoutMismatch`).
Layout = Literal["clustered", "partitioned", "none"]
# the writer feature of a clustered table (in its protocol, or `DESCRIBE DETAIL`'s `tableFeatures`)
_CLUSTERING_FEATURE = "clustering"


def layout_of(partition_columns: Any, writer_features: Any) -> Layout:
    """A table's layout from its metadata's partition columns and its protocol's writer features."""
    if PARTITION_COLUMN in (partition_columns or ()):
        return "partitioned"
    return "clustered" if _CLUSTERING_FEATURE in (writer_features or ()) else "none"


# operations of the Delta log that maintenance writes (VACUUM logs a START and an END commit)
OPTIMIZE = "OPTIMIZE"
VACUUM_START = "VACUUM START"
VACUUM_END = "VACUUM END"
RESTORE = "RESTORE"
DELETE = "DELETE"  # a DELETE statement's commit (Spark SQL's, delta-rs's `DeltaTable.delete`)
# commits that rewrite or delete files without changing the table's rows
FILE_MAINTENANCE = frozenset({OPTIMIZE, VACUUM_START, VACUUM_END})


@dataclass(frozen=True)
class HistoryEntry:
    version: int
    operation: str
    user_metadata: str | None
    metrics: Mapping[str, str] = field(default_factory=dict, compare=False)
    parameters: Mapping[str, str] = field(default_factory=dict, compare=False)
    timestamp: float | None = field(default=None, compare=False)  # the commit's time (Unix seconds)

    @property
    def restored_version(self) -> int | None:
        """The version a RESTORE brought the table back to (None: not a RESTORE, or one given by a
        timestamp only)."""
        if self.operation != RESTORE:
            return None
        version = self.parameters.get("version")
        return int(version) if version not in (None, "", "None", "null") else None


def as_strings(mapping: Mapping[str, Any] | None) -> dict[str, str]:
    return {key: str(value) for key, value in (mapping or {}).items() if value is not None}


class DeltaLog:
    """The Delta log of a table read with delta-rs, in this process (`storage_options`: delta-rs's, for
    a table on object storage: `ProjectConfig.storage_options`).

    One snapshot of the table is opened on first use and brought up to date in place on every read
    after (delta-rs reads only the commits since): a load reads the whole log once, whatever it asks
    (its state, its commits landing, the statistics its checks need)."""

    def __init__(self, path: str, storage_options: Mapping[str, str] | None = None):
        self.path = path
        self.storage_options = dict(storage_options or {})
        self._snapshot: Any = None

    def snapshot(self) -> Any:
        """The table as of its newest commit (a `deltalake.DeltaTable`)."""
        if self._snapshot is None:
            from deltalake import DeltaTable

            self._snapshot = DeltaTable(self.path, storage_options=self.storage_options or None)
        else:
            self._snapshot.update_incremental()
        return self._snapshot

    def snapshot_at(self, version: int) -> Any:
        """A snapshot of a past version of the table, of its own (the current one stays as it is)."""
        from deltalake import DeltaTable

        return DeltaTable(self.path, version=version, storage_options=self.storage_options or None)

    def add_actions(self) -> dict[str, list]:
        """The data files of the current version with their partition values and statistics."""
        import pyarrow as pa

        # an Arrow table of delta-rs's own (arro3), taken over by pyarrow without a copy
        return pa.table(self.snapshot().get_add_actions(flatten=True)).to_pydict()

    def version(self) -> int:
        """The table's newest version."""
        return self.snapshot().version()

    def partitioned(self, snapshot: Any = None) -> bool:
        """Whether the table (`snapshot`: a version of it) has a folder per feed partition
        (`PARTITIONED BY (partition_id)`: partition values and statistics per partition in the log);
        else it is clustered by `partition_id` or has no layout, and a data file holds rows of many
        partitions."""
        return PARTITION_COLUMN in (snapshot or self.snapshot()).metadata().partition_columns

    def layout(self) -> Layout:
        snapshot = self.snapshot()
        return layout_of(snapshot.metadata().partition_columns, snapshot.protocol().writer_features)

    def column_types(self) -> dict[str, str]:
        """The table's columns and their Delta type names (`string`, `variant`, `struct`...)."""
        return {field.name: str(field.type.type) for field in self.snapshot().schema().fields}

    def partition_columns(
        self,
        snapshot: Any = None,
        paths: set[str] | None = None,
        wanted: set[int] | None = None,
        columns: tuple[str, ...] = (PARTITION_COLUMN, "position"),
    ) -> pa.Table:
        """The `columns` (`partition_id` among them) of the table's rows (`snapshot`: of a version), read
        by delta-rs in this process: of the data files `paths` only, or of the files whose statistics
        (min/max `partition_id`) admit one of the `wanted` partitions, and then of those partitions'
        rows only. Raises where delta-rs cannot read the data (deletion vectors, column mapping) and
        where one of `paths` is not a file of the snapshot (rewritten by a later commit)."""
        import urllib.parse

        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        snapshot = snapshot or self.snapshot()
        if snapshot.metadata().configuration.get("delta.columnMapping.mode", "none") != "none":
            # the files' columns have physical names: Arrow would read the logical ones as nulls
            raise StorageError(f"the Delta table {self.path} uses column mapping: its files are read by Spark")
        if wanted is not None and paths is None:
            paths = _files_admitting(snapshot, wanted)
        dataset = snapshot.to_pyarrow_dataset()
        if paths is not None:
            fragments = [f for f in dataset.get_fragments() if urllib.parse.unquote(f.path) in paths]
            if len(fragments) != len(paths):
                raise StorageError(f"{len(paths) - len(fragments)} of the files asked for are not in {self.path} now")
            dataset = ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem)
        rows = dataset.to_table(columns=list(columns))
        if wanted is not None:
            import array

            import pyarrow as pa

            # built from a buffer: `pa.array(list)` makes pyarrow import pandas (~1.5 s, `read/rows.py`)
            values = array.array("q", sorted(wanted))
            value_set = pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])
            keys = rows[PARTITION_COLUMN].cast(pa.int64())
            rows = rows.filter(pc.is_in(keys, value_set=value_set))
        return rows

    def added_files(self, version: int) -> set[str] | None:
        """The data files the commit at `version` added (paths as the table's dataset names them); None
        where its commit file left the log (Delta's log cleanup) or cannot be read.

        delta-rs has no public call for one commit's actions: the commit file (`_delta_log/<version>.json`,
        the Delta protocol's) is read through the file system the table's dataset reads with."""
        import json
        import urllib.parse

        try:
            filesystem = self.snapshot().to_pyarrow_dataset().filesystem
            with filesystem.open_input_stream(f"_delta_log/{version:020d}.json") as commit_file:
                actions = [json.loads(line) for line in commit_file.read().decode().splitlines() if line.strip()]
        except Exception:  # noqa: BLE001 - delta-rs (a reader feature it lacks) and the storage raise many types
            return None
        return {urllib.parse.unquote(action["add"]["path"]) for action in actions if "add" in action}

    def history(self, limit: int | None) -> list[HistoryEntry]:
        """The table's commits, newest first (`limit`: the newest ones only)."""
        return [
            HistoryEntry(
                h["version"],
                h.get("operation", ""),
                h.get("userMetadata"),
                as_strings(h.get("operationMetrics")),
                as_strings(h.get("operationParameters")),
                h["timestamp"] / 1000 if h.get("timestamp") is not None else None,
            )
            for h in numbered_history(self.snapshot(), limit)
        ]


_HISTORY_ATTEMPTS = 10


def numbered_history(snapshot: Any, limit: int | None) -> list[dict[str, Any]]:
    """`snapshot`'s commits (a `deltalake.DeltaTable`), newest first, each with its true version, none
    newer than the snapshot.

    delta-rs 1.6's `history` lists the commits from the log's newest, but numbers them down from the
    snapshot's version: a commit that lands between the snapshot and the call shifts every number (seen
    in the chaos test: version 10's feed state read as version 9's; a pinned older snapshot lists the
    newer commits too). The log's newest version, the same just before and just after the listing, is
    where the listing started: the shift. `get_latest_version` is delta-rs's internal table's: no public
    call says the log's newest version without loading its snapshot."""
    newest_of = snapshot._table.get_latest_version
    for _ in range(_HISTORY_ATTEMPTS):
        newest = newest_of()
        listed = snapshot.history(limit)
        if newest_of() == newest:
            shift, version = newest - snapshot.version(), snapshot.version()
            numbered = ({**h, "version": h["version"] + shift} for h in listed)
            return [h for h in numbered if h["version"] <= version]
    raise StorageError(f"the Delta log of {snapshot.table_uri} kept changing while its history was read")


def _files_admitting(snapshot: Any, wanted: set[int]) -> set[str]:
    """The data files whose min/max `partition_id` admits one of `wanted` (a file without statistics: all)."""
    import bisect

    import pyarrow as pa

    actions = pa.table(snapshot.get_add_actions(flatten=True)).to_pydict()
    lows = actions.get(f"min.{PARTITION_COLUMN}")
    highs = actions.get(f"max.{PARTITION_COLUMN}")
    if lows is None or highs is None:
        return set(actions["path"])
    ordered = sorted(wanted)
    admitted = set()
    for path, low, high in zip(actions["path"], lows, highs, strict=True):
        if low is None or high is None:
            admitted.add(path)
            continue
        at = bisect.bisect_left(ordered, low)
        if at < len(ordered) and ordered[at] <= high:
            admitted.add(path)
    return admitted
