"""Table engines: what reads and writes a feed's Delta table on behalf of `DeltaSink`.

* `DeltaRsEngine` (default, `writer: deltalake`): delta-rs, in the load process. Rows go from the
  page reader's bytes to Parquet in Rust with no JVM on the data path; this is what keeps a load at
  the speed of fetching. A commit is pinned to the table snapshot its feed state was read from, and
  delta-rs refuses it when a commit made since carries our application transaction (another load),
  so a write that returns has landed, and the sink takes its new state from it without a read.
* `SparkEngine` (`writer: spark`): the Spark session (Spark Connect or local) writes, for clusters
  where only Spark can reach the lakehouse storage. Delta Spark silently skips a commit whose
  `txnVersion` was already used; the sink notices by reading the history back. The Delta log (the
  history, and the stored event ids of deduplication) is read with delta-rs when this process can
  open the table, through Spark otherwise; where they share the table's file system, the rows reach
  Spark as a Parquet file beside the table rather than as an Arrow batch.

Both write the same table: same schema, same commit metadata, same application transaction, so
either engine (and any Delta reader) can continue a table the other wrote.
"""
from __future__ import annotations

import contextlib
import logging
import shutil
import time
import uuid

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .table import PARTITION_COLUMN, TABLE_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TXN_APP_ID = "feedapi-dagster"
# beside a table's data (Delta ignores `_` folders): a rebuild's staged batches, the Spark engine's staged rows
STAGING_FOLDER = "_feedapi_staging"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HistoryEntry:
    version: int
    operation: str
    user_metadata: str | None


@dataclass(frozen=True)
class Commit:
    """One commit of the sink: rows (appended, or replacing the `replace` partitions' rows, plus the
    rows staged earlier by a rebuild) with the feed state as user metadata, under `txn_version`."""

    rows: pa.Table
    user_metadata: str
    txn_version: int
    replace: tuple[int, ...] = ()
    staged: str | None = None


class TableEngine(Protocol):
    path: str
    # events per commit when the feed's `load.batch_events` is not set: the last batch of a load is
    # written after its last page, so smaller batches end a load sooner, until per-commit costs win
    batch_events: int

    def ensure_table(self) -> None: ...

    def history(self, limit: int | None, refresh: Any = None) -> tuple[Any, list[HistoryEntry]]:
        """A snapshot of the table to commit against, and its history, newest first. `refresh`: a snapshot
        this engine returned before, brought up to date in place instead of reading the table anew."""

    def write(self, commit: Commit, base: Any) -> int | None:
        """Commit against `base` (a snapshot from `history`); raises on a conflicting concurrent commit.
        Returns the version the commit landed at when returning proves it landed, else None: the
        caller must look for it (Delta Spark skips a write whose txnVersion was used, silently)."""

    def is_conflict(self, error: BaseException) -> bool: ...

    def stage(self, rows: pa.Table, staging: str) -> None:
        """Keep a rebuild's batch aside (in a Delta table at `staging`) until its one final commit."""

    def event_ids(self, partition_ids: list[int]) -> list[tuple[int, str]]: ...

    def compact(self) -> None: ...


def _writer_properties():
    """Parquet settings of delta-rs writes. Payloads are unique JSON texts: a dictionary page for them is
    built only to be dropped, and min/max statistics of JSON text skip nothing; both cost the CPU
    the readers share (~10 % of delta-rs's CPU in a 1M-event load, measured)."""
    from deltalake import ColumnProperties, WriterProperties

    return WriterProperties(compression="SNAPPY", column_properties={
        "payload": ColumnProperties(dictionary_enabled=False, statistics_enabled="NONE")})


def local_path(path: str) -> str:
    """The file system path of a table path with no scheme or `file:`, else ""."""
    parts = urlsplit(path)
    return parts.path if parts.scheme in ("", "file") else ""


def _in_partitions(partition_ids) -> str:
    return f"{PARTITION_COLUMN} IN ({','.join(str(int(p)) for p in partition_ids)})"


class DeltaRsEngine:
    # a delta-rs commit's fixed cost is small next to encoding its rows: 50,000 events (10-20 MB) per
    # commit cut a 400k-event sync by ~0.2 s against 200,000, and changed nothing measurable at 1M
    batch_events = 50_000

    def __init__(self, path: str, storage_options: dict[str, str] | None = None):
        self.path = path
        self.storage_options = storage_options

    def _table(self, path: str | None = None):
        from deltalake import DeltaTable

        return DeltaTable(path or self.path, storage_options=self.storage_options)

    def ensure_table(self) -> None:
        from deltalake import DeltaTable

        if DeltaTable.is_deltatable(self.path, storage_options=self.storage_options):
            return
        try:
            DeltaTable.create(self.path, schema=TABLE_SCHEMA, partition_by=[PARTITION_COLUMN], mode="ignore",
                              storage_options=self.storage_options)
        except Exception:
            # two first loads racing to create the table: the loser's version 0 already exists
            if not DeltaTable.is_deltatable(self.path, storage_options=self.storage_options):
                raise

    def history(self, limit: int | None, refresh=None):
        # Opening a table replays its log since the last checkpoint (up to 100 commits: 5-60 ms, much of
        # it holding the GIL the readers need); bringing a known snapshot up to date reads only the new
        # commits (1-3 ms).
        if refresh is None:
            table = self._table()
        else:
            table = refresh
            table.update_incremental()
        entries = [HistoryEntry(h["version"], h.get("operation", ""), h.get("userMetadata"))
                   for h in table.history(limit)]
        return table, entries

    def write(self, commit: Commit, base) -> int:
        from deltalake import CommitProperties, Transaction, write_deltalake

        data: pa.Table | pa.RecordBatchReader = commit.rows
        if commit.staged is not None:
            staged = self._table(commit.staged).to_pyarrow_dataset()
            batches = (b for source in (staged.to_batches(), commit.rows.to_batches()) for b in source)
            data = pa.RecordBatchReader.from_batches(TABLE_SCHEMA, (b.select(TABLE_SCHEMA.names) for b in batches))
        properties = CommitProperties(custom_metadata={"userMetadata": commit.user_metadata},
                                      app_transactions=[Transaction(TXN_APP_ID, commit.txn_version)])
        if commit.replace:
            write_deltalake(base, data, mode="overwrite", predicate=_in_partitions(commit.replace),
                            commit_properties=properties, writer_properties=_writer_properties())
        else:
            write_deltalake(base, data, mode="append", commit_properties=properties,
                            writer_properties=_writer_properties())
        # delta-rs raises rather than skip a used txnVersion, and brings `base` up to the version it
        # committed (past any commit it had to retry over): that version is this commit
        return base.version()

    def is_conflict(self, error: BaseException) -> bool:
        from deltalake.exceptions import CommitFailedError

        return isinstance(error, CommitFailedError)

    def stage(self, rows: pa.Table, staging: str) -> None:
        from deltalake import write_deltalake

        write_deltalake(staging, rows, mode="append", storage_options=self.storage_options,
                        writer_properties=_writer_properties())

    def event_ids(self, partition_ids: list[int]) -> list[tuple[int, str]]:
        dataset = self._table().to_pyarrow_dataset()
        found = dataset.to_table(columns=[PARTITION_COLUMN, "event_id"], filter=(
            pc.field(PARTITION_COLUMN).isin(list(partition_ids)) & pc.field("event_id").is_valid()))
        return list(zip(found.column(0).to_pylist(), found.column(1).to_pylist()))

    def compact(self) -> None:
        self._table().optimize.compact(writer_properties=_writer_properties())


class SparkEngine:
    batch_events = 200_000  # each commit is a Spark job: a few hundred ms before its first row

    def __init__(self, spark: "SparkSession", path: str, *, read_log: Literal["auto", "spark"] = "auto"):
        """`read_log`: `auto` reads the Delta log with delta-rs when this process can open the table
        (decided by `ensure_table`), `spark` always through the Spark session."""
        self.spark = spark
        self.path = path
        self.read_log = read_log
        self._log_reader: DeltaRsEngine | None = None
        self._can_stage = True

    def ensure_table(self) -> None:
        columns = ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in TABLE_SCHEMA)
        try:
            self.spark.sql(f"CREATE TABLE IF NOT EXISTS delta.`{self.path}` ({columns}) USING delta "
                           f"PARTITIONED BY ({PARTITION_COLUMN})")
        except Exception:  # noqa: BLE001 - Spark's error types differ between classic and Connect
            # Two first loads racing to create the table: the loser's CREATE fails, named by timing
            # (protocol changed, table exists, location not empty...); the winner's table is the table.
            if not self._readable(within_seconds=10):
                raise
        self._log_reader = self._open_log_reader()
        self._remove_abandoned_rows()

    def _open_log_reader(self) -> DeltaRsEngine | None:
        # A Spark query over the log (DESCRIBE HISTORY) costs 0.3-0.4 s on a running Connect server,
        # and a commit reads the history before and after it: ~0.7 s of a 2.1 s 16-event load, where
        # delta-rs reads the same log in milliseconds. A table only the cluster reaches stays with Spark.
        if self.read_log == "spark":
            return None
        reader = DeltaRsEngine(self.path)
        try:
            reader.history(1)
        except Exception as error:  # noqa: BLE001 - delta-rs raises many types for an unreachable table
            log.info("reading the Delta log of %s through Spark: delta-rs cannot open it here (%s: %s)",
                     self.path, type(error).__name__, str(error).splitlines()[0][:200] if str(error) else "")
            return None
        return reader

    def _readable(self, within_seconds: float) -> bool:
        deadline = time.monotonic() + within_seconds
        while True:
            try:
                self.spark.sql(f"DESCRIBE HISTORY delta.`{self.path}` LIMIT 1").collect()
                return True
            except Exception:  # noqa: BLE001
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.2)

    def history(self, limit: int | None, refresh=None):
        if self._log_reader is not None:
            return self._log_reader.history(limit, refresh)
        clause = f" LIMIT {limit}" if limit else ""
        rows = self.spark.sql(f"DESCRIBE HISTORY delta.`{self.path}`{clause}") \
            .select("version", "operation", "userMetadata").collect()
        entries = [HistoryEntry(r["version"], r["operation"], r["userMetadata"]) for r in rows]
        return None, sorted(entries, key=lambda e: e.version, reverse=True)

    @contextlib.contextmanager
    def _frame(self, rows: pa.Table) -> Iterator[Any]:
        """The rows as a Spark DataFrame, for one write.

        An Arrow batch handed to Spark becomes a local relation that the server converts and plans row
        by row: 200,000 rows cost a running Connect server 6.8-8.6 CPU seconds. Where this process
        and Spark share the table's file system, the rows go instead as a Parquet file in
        `_feedapi_staging/rows-<id>` beside the table (Delta ignores `_` folders), which Spark reads
        vectorized: 1.8-3.2 CPU seconds. The file goes when the write is done or failed; one left by
        a killed load is removed by a later `ensure_table`."""
        if not rows.num_rows:
            yield self.spark.createDataFrame([], ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in TABLE_SCHEMA))
            return
        folder = self._stage_rows(rows)
        if folder is None:
            yield self.spark.createDataFrame(rows)
            return
        try:
            yield self.spark.read.parquet(str(folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _stage_rows(self, rows: pa.Table) -> Path | None:
        """The folder of a Parquet file of `rows` beside the table, or None where none can be written
        (a table only Spark reaches, or a read-only mount of it here: Spark gets the Arrow batch)."""
        staging = self._staging_folder()
        if staging is None:
            return None
        folder = staging / f"{_STAGED_ROWS}{uuid.uuid4().hex}"
        try:
            folder.mkdir(parents=True)
            # uncompressed: read once, by a process on the same file system
            pq.write_table(rows, folder / "rows.parquet", compression="none")
        except OSError as error:
            log.info("handing rows to Spark as Arrow batches: cannot write files in %s (%s)", staging, error)
            shutil.rmtree(folder, ignore_errors=True)
            self._can_stage = False
            return None
        return folder

    def _staging_folder(self) -> Path | None:
        local = local_path(self.path)
        if self._log_reader is None or not self._can_stage or not local:
            return None
        return Path(local) / STAGING_FOLDER

    def _remove_abandoned_rows(self) -> None:
        staging = self._staging_folder()
        if staging is None or not staging.is_dir():
            return
        cutoff = time.time() - _ABANDONED_AFTER_SECONDS
        for folder in staging.glob(f"{_STAGED_ROWS}*"):
            with contextlib.suppress(OSError):
                if folder.stat().st_mtime < cutoff:
                    shutil.rmtree(folder)

    def write(self, commit: Commit, base) -> None:
        # None: Delta Spark may have skipped the write (a used txnVersion); the sink looks for it
        with self._frame(commit.rows) as frame:
            if commit.staged is not None:
                frame = self.spark.read.format("delta").load(commit.staged).unionByName(frame)
            writer = (frame.write.format("delta")
                      .option("txnAppId", TXN_APP_ID)
                      .option("txnVersion", str(commit.txn_version))
                      .option("userMetadata", commit.user_metadata))
            if commit.replace:
                writer = writer.mode("overwrite").option("replaceWhere", _in_partitions(commit.replace))
            else:
                writer = writer.mode("append")
            writer.save(self.path)

    def is_conflict(self, error: BaseException) -> bool:
        text = f"{type(error).__name__} {error}"
        return "DELTA_CONCURRENT" in text or "Concurrent" in text

    def stage(self, rows: pa.Table, staging: str) -> None:
        with self._frame(rows) as frame:
            frame.write.format("delta").mode("append").save(staging)

    def event_ids(self, partition_ids: list[int]) -> list[tuple[int, str]]:
        if self._log_reader is not None:
            return self._log_reader.event_ids(partition_ids)
        rows = self.spark.sql(
            f"SELECT DISTINCT partition_id, event_id FROM delta.`{self.path}` "
            f"WHERE {_in_partitions(partition_ids)} AND event_id IS NOT NULL").collect()
        return [(r[0], r[1]) for r in rows]

    def compact(self) -> None:
        self.spark.sql(f"OPTIMIZE delta.`{self.path}`").collect()


# staged rows of a write (see `SparkEngine._frame`), and the age at which a killed load's are removed
_STAGED_ROWS = "rows-"
_ABANDONED_AFTER_SECONDS = 3600

_SPARK_TYPES = {pa.int32(): "INT", pa.int64(): "BIGINT", pa.string(): "STRING", TABLE_SCHEMA.field("loaded_at").type:
                "TIMESTAMP"}
