"""A feed's Delta table: written by Spark's Delta writer, its log read by delta-rs where the run can.

`FeedTable` is what `DeltaSink` writes through. Every write is a Spark job (Spark's Delta writer, on
the embedded server or a cluster), carrying the feed state as the commit's `userMetadata` under
Delta's application transaction (`txnAppId`/`txnVersion`). Delta Spark silently skips a write whose
`txnVersion` was already used; the sink notices by reading the history back.

The Delta log (the history with the committed states) is read by `delta_log.DeltaLog` where the run
process can open the table, else through Spark (`DESCRIBE HISTORY`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from feedapi_dagster.errors import LayoutMismatch
from feedapi_dagster.lakehouse.delta_log import DeltaLog, HistoryEntry, Layout, as_strings, layout_of
from feedapi_dagster.lakehouse.payload_form import (
    DATA_COLUMN,
    DATA_SQL,
    DEFAULT_PAYLOAD_FORM,
    FORM_COLUMNS_DDL,
    FormCounts,
    PayloadForm,
    data_column,
    form_mismatch,
    form_of,
)
from feedapi_dagster.lakehouse.typed_columns import table_payload_columns, typed_rows
from feedapi_dagster.planning.payload_columns import RESCUE_COLUMN, ColumnsSettings, PayloadColumn
from feedapi_dagster.read.rows import PARTITION_COLUMN, TABLE_SCHEMA, spark_ddl
from feedapi_dagster.spark.failures import first_line
from feedapi_dagster.spark.storage import explain_storage_error

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TXN_APP_ID = "feedapi-dagster"
# beside a table's data (Delta ignores `_` folders): the notes of loads' read tasks (`progress.py`)
PROGRESS_FOLDER = "_feedapi_progress"
# a killed load's notes are removed by a later load after this long
ABANDONED_AFTER_SECONDS = 3600

log = logging.getLogger(__name__)

TABLE_DDL = spark_ddl(TABLE_SCHEMA)
DEFAULT_LAYOUT: Layout = "clustered"
LAYOUT_CLAUSE: Mapping[Layout, str] = {
    "clustered": f"CLUSTER BY ({PARTITION_COLUMN})",
    "partitioned": f"PARTITIONED BY ({PARTITION_COLUMN})",
    "none": "",
}


def create_table_sql(path: str, layout: Layout, payload_form: PayloadForm = DEFAULT_PAYLOAD_FORM) -> str:
    """The table's creation with `layout` and the columns of `payload_form`. File statistics only of what
    is looked up by them: positions, and the feed's partition where it is not a partition column (whose
    value is its folder's): Delta requires statistics of clustering columns, and data skipping reads
    them. Delta's default, the first 32 columns, has every commit compute min/max of each payload too."""
    stats = "position" if layout == "partitioned" else f"{PARTITION_COLUMN},position"
    columns = ", ".join(filter(None, (TABLE_DDL, FORM_COLUMNS_DDL[payload_form])))
    return (
        f"CREATE TABLE IF NOT EXISTS delta.`{path}` ({columns}) USING delta {LAYOUT_CLAUSE[layout]} "
        f"TBLPROPERTIES ('delta.dataSkippingStatsColumns' = '{stats}')"
    )


def layout_mismatch(path: str, found: Layout, wanted: Layout) -> LayoutMismatch:
    return LayoutMismatch(
        f"the Delta table {path} is {found} ({LAYOUT_CLAUSE[found] or 'no layout'}) and the feed's layout is "
        f"{wanted}: a table's layout cannot change in place. Set `layout: {found}` (or leave it unset) to go "
        f'on loading this table, or move it to {wanted} as the README\'s "Table layout" says (a copy whose '
        "first commit carries the cursor of record)"
    )


# Delta refuses a VACUUM retention under 7 days unless this check is off; `maintenance.py`
# computes a retention that covers the time-travel window and running loads, so the check is lifted for it
_RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
_VACUUM_LOGGING = "spark.databricks.delta.vacuum.logging.enabled"
# the tasks VACUUM lists the table's files with (Spark's default, 10,000, makes a VACUUM of a small
# table take several times as long as a few tasks do: `benchmarks/README.md`)
_LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


@dataclass(frozen=True)
class Written:
    """What a write of a variant or columns table says beyond its rows: its counts (`FormCounts`, ready
    once the job is over) and, of a columns table, the payload columns it added or gave new fields."""

    counts: FormCounts
    added: tuple[PayloadColumn, ...] = ()
    extended: tuple[PayloadColumn, ...] = ()


@dataclass(frozen=True)
class Commit:
    """One commit of the sink: rows (appended, or replacing the `replace` partitions' rows) with the
    feed state as user metadata, under `txn_version`; `partitions`: how many partitions the rows may hold
    (at least), for the count of their unparsed payloads (`FormCounts`)."""

    rows: DataFrame
    user_metadata: str
    txn_version: int
    replace: tuple[int, ...] = ()
    partitions: int = 0


def local_path(path: str) -> str:
    """The file system path of a table path with no scheme or `file:`, else ""."""
    parts = urlsplit(path)
    return parts.path if parts.scheme in ("", "file") else ""


def in_partitions(partition_ids: Any) -> str:
    return f"{PARTITION_COLUMN} IN ({','.join(str(int(p)) for p in partition_ids)})"


class FeedTable:
    """The Delta table of one feed, written by a Spark session (Spark Connect or classic)."""

    def __init__(
        self,
        spark: SparkSession,
        path: str,
        *,
        read_log: Literal["auto", "spark"] = "auto",
        storage_options: Mapping[str, str] | None = None,
        layout: Layout | None = None,
        payload_form: PayloadForm | None = None,
        columns: ColumnsSettings | None = None,
    ):
        """`read_log`: `auto` reads the Delta log with delta-rs when this process can open the table
        (decided by `ensure_table`), `spark` always through the Spark session. `storage_options`:
        delta-rs's, for a table on object storage. `layout`: the feed's setting, what `ensure_table`
        creates the table with and finds an existing one in (None: `DEFAULT_LAYOUT` for a new table,
        an existing one as it is). `payload_form`: the feed's setting, the same way (None: json for a new
        table, an existing one as it is). `columns`: how a columns table's typed columns evolve."""
        self.spark = spark
        self.path = path
        self.read_log = read_log
        self.storage_options = dict(storage_options or {})
        self.layout = layout
        self.payload_form = payload_form
        self.columns = columns or ColumnsSettings()
        # a columns table's payload columns after this object's newest write (None: no write yet)
        self.written_columns: tuple[PayloadColumn, ...] | None = None
        # the form the rows are written in: the table's, once `ensure_table` found or made it
        self.form: PayloadForm = payload_form or DEFAULT_PAYLOAD_FORM
        self._log: DeltaLog | None = None

    @property
    def delta_log(self) -> DeltaLog | None:
        """The log as delta-rs reads it here; None where only Spark reaches the table (or before
        `ensure_table`)."""
        return self._log

    # ------------------------------------------------------------------ set-up
    def ensure_table(self) -> None:
        """Creates the table with its layout and payload form where there is none; `LayoutMismatch` where
        one exists with another layout than the feed's setting; the payload's form as `ensure_form` says."""
        # a table delta-rs opens exists: no Spark statement (0.3-0.4 s of every run) to create it
        self._log = self._open_log(quiet=True)
        if self._log is None:
            try:
                self.spark.sql(create_table_sql(self.path, self.layout or DEFAULT_LAYOUT, self.form))
            except Exception as error:  # noqa: BLE001 - Spark's error types differ between classic and Connect
                if (explained := explain_storage_error(self.path, error)) is not None:
                    raise explained from None  # what to set, not Hadoop's stack trace
                # Two first loads racing to create the table: the loser's CREATE fails, named by timing
                # (protocol changed, table exists, location not empty...); the winner's table is the table.
                if not self._readable(within_seconds=10):
                    raise
            self._log = self._open_log()
        if self.layout is not None and (found := self.found_layout()) != self.layout:
            raise layout_mismatch(self.path, found, self.layout)
        self.ensure_form()
        self._remove_abandoned_progress()

    def ensure_form(self) -> None:
        """The table's payload form (`form`), brought to the feed's setting where it can be:

        * json table, `variant` or `columns` setting: the form's column (`data`, `_rescued_data`) is added
          in place (`ALTER TABLE ... ADD COLUMNS`, one metadata commit, no file rewritten; it carries no
          feed state, which stays the newest load's). The rows loaded before have it NULL (and no typed
          columns): their `payload` is all they had, and a rebuild of their partitions fills them.
        * any other change (variant or columns table, another setting): `PayloadFormMismatch`, nothing
          loaded. Loading on would leave the form's columns NULL in the new rows, which a query takes for
          payloads that had nothing to say; dropping columns takes Delta column mapping (a protocol
          upgrade some readers refuse) and cannot be undone: the user says which they want.
        * no setting (a `FeedTable` made from a path only: the stream's commits, the state command):
          the table as it is.
        """
        found = self.found_form()
        if self.payload_form is None or found == self.payload_form:
            self.form = found
        elif found == "json":
            added = FORM_COLUMNS_DDL[self.payload_form]
            try:
                self.spark.sql(f"ALTER TABLE delta.`{self.path}` ADD COLUMNS ({added})")
                log.info(
                    "added the column `%s` to %s (the feed's payload_form is %s)", added, self.path, self.payload_form
                )
            except Exception:  # noqa: BLE001 - Spark's error types differ between classic and Connect
                if self.found_form() != self.payload_form:  # not another load's ALTER of the same moment
                    raise
            self.form = self.payload_form
        else:
            raise form_mismatch(self.path, found, self.payload_form)

    def found_form(self) -> PayloadForm:
        """The existing table's payload form, from its schema (delta-rs, or Spark's reading of it)."""
        if self._log is not None:
            return form_of(self._log.column_types())
        fields = self.frame().schema.fields
        return form_of({field.name: field.dataType.simpleString() for field in fields})

    def found_layout(self) -> Layout:
        """The existing table's layout, from its metadata and protocol (delta-rs, or `DESCRIBE DETAIL`)."""
        if self._log is not None:
            return self._log.layout()
        detail = self.spark.sql(f"DESCRIBE DETAIL delta.`{self.path}`").select("partitionColumns", "tableFeatures")
        row = detail.first()
        assert row is not None  # DESCRIBE DETAIL answers one row
        return layout_of(row[0], row[1])

    def _open_log(self, quiet: bool = False) -> DeltaLog | None:
        if self.read_log == "spark":
            return None
        reader = DeltaLog(self.path, self.storage_options)
        try:
            reader.history(1)
        except Exception as error:  # noqa: BLE001 - delta-rs raises many types for an unreachable table
            if not quiet:
                log.info(
                    "reading the Delta log of %s through Spark: delta-rs cannot open it here (%s: %s)",
                    self.path,
                    type(error).__name__,
                    first_line(error, 200),
                )
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

    # ------------------------------------------------------------------ the log
    def history(self, limit: int | None) -> list[HistoryEntry]:
        if self._log is not None:
            return self._log.history(limit)
        clause = f" LIMIT {limit}" if limit else ""
        rows = (
            self.spark.sql(f"DESCRIBE HISTORY delta.`{self.path}`{clause}")
            .select("version", "timestamp", "operation", "userMetadata", "operationMetrics", "operationParameters")
            .collect()
        )
        entries = [
            HistoryEntry(
                r["version"],
                r["operation"],
                r["userMetadata"],
                as_strings(r["operationMetrics"]),
                as_strings(r["operationParameters"]),
                r["timestamp"].timestamp() if r["timestamp"] is not None else None,
            )
            for r in rows
        ]
        return sorted(entries, key=lambda e: e.version, reverse=True)

    # ------------------------------------------------------------------ data
    def frame(self, version: int | None = None) -> DataFrame:
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(self.path)

    def last_rows(self, version: int | None, partitions: Any = None) -> dict[int, tuple[int, str]]:
        """Each partition's newest row (of `partitions`, or all): its position and its page's cursor (one
        aggregate, by Spark)."""
        from pyspark.sql import functions as F

        frame = self.frame(version)
        if partitions is not None:
            frame = frame.where(in_partitions(partitions))
        rows = (
            frame.groupBy(PARTITION_COLUMN)
            .agg(F.max("position").alias("position"), F.max_by("cursor", "position").alias("cursor"))
            .collect()
        )
        return {row[PARTITION_COLUMN]: (row["position"], row["cursor"]) for row in rows}

    def write(self, commit: Commit, run_id: str | None) -> Written | None:
        """One Spark job: the rows, stamped with the commit's time and run, into one Delta commit.
        It may have been skipped (a used txnVersion): the sink looks for it in the history. A variant or
        columns table's: the counts the job observed, and the columns it added (`Written`).

        A columns table's rows are looked at first (a Spark job over them: call it with kept rows), and
        their typed columns planned against the table's schema as it is now (`typed_columns.py`); new
        columns come in the rows' commit (`mergeSchema`)."""
        from pyspark.sql import functions as F

        loaded_at = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        frame = commit.rows.withColumn("loaded_at", F.lit(loaded_at).cast("timestamp")).withColumn(
            "run_id", F.lit(run_id).cast("string")
        )
        written = None
        evolves = False
        if self.form == "variant":  # parsed and counted in the same job: the rows, their variant, one commit
            written = Written(FormCounts(commit.partitions))
            frame = written.counts.observe(frame.withColumn(DATA_COLUMN, data_column()))
        elif self.form == "columns":
            typed = typed_rows(frame, self.payload_columns(), self.columns)
            written = Written(FormCounts(commit.partitions), typed.plan.added, typed.plan.extended)
            frame = written.counts.observe(typed.frame, rescued=True).drop(DATA_COLUMN)
            evolves = typed.plan.changes_schema
            self.written_columns = typed.plan.columns
        # the txn version is the commit's optimistic lock (`DeltaSink.commit`); Delta 4.4 answers "which
        # versions has this app committed" by reconstructing the snapshot's state (a Spark job, 0.5-0.6 s
        # a commit on this machine, whatever the rows: issue #38's notes), the price of that lock
        writer = (
            frame.write.format("delta")
            .option("txnAppId", TXN_APP_ID)
            .option("txnVersion", str(commit.txn_version))
            .option("userMetadata", commit.user_metadata)
        )
        if evolves:
            writer = writer.option("mergeSchema", "true")
        if commit.replace:
            writer = writer.mode("overwrite").option("replaceWhere", in_partitions(commit.replace))
        else:
            writer = writer.mode("append")
        writer.save(self.path)
        return written

    def declare(self, server: Mapping[str, str], logger: logging.Logger | logging.LoggerAdapter = log) -> None:
        """Take the column types the feed's server declares (`FeedClient.declared_columns`: a Nakadi event
        type's JSON Schema) for a columns table's new columns; the feed's own `declared` win."""
        if server:
            self.columns = self.columns.with_server_declared(server)
            logger.info("the feed's server declares the types of payload keys %s", ", ".join(sorted(server)))

    def payload_columns(self) -> list[PayloadColumn]:
        """A columns table's typed payload columns as they are now (Spark reads the newest schema)."""
        return table_payload_columns(self.frame())

    def committed_counts(self, ranges: Mapping[int, tuple[int, int]]) -> dict[int, tuple[int, int | None]]:
        """Of the rows at positions `[start, end)` of each partition in `ranges`: how many have payloads
        Spark could not parse, and (a columns table's) values in `_rescued_data` (None for another form),
        per partition: one Spark aggregate over those rows. For the rows the feed's stream committed:
        its write job's own counts (`FormCounts`) stay where `foreachBatch` ran."""
        from pyspark.sql import functions as F

        if not ranges:
            return {}
        where = " OR ".join(
            f"({PARTITION_COLUMN} = {int(p)} AND position >= {int(a)} AND position < {int(b)})"
            for p, (a, b) in ranges.items()
        )
        counts = [F.count_if(F.expr(f"({DATA_SQL}) IS NULL AND payload IS NOT NULL")).alias("unparsed")]
        if self.form == "columns":
            counts.append(F.count_if(F.col(RESCUE_COLUMN).isNotNull()).alias("rescued"))
        rows = self.frame().where(where).groupBy(PARTITION_COLUMN).agg(*counts).collect()
        found = {
            row[PARTITION_COLUMN]: (row["unparsed"], row["rescued"] if self.form == "columns" else None) for row in rows
        }
        return {pid: found.get(pid, (0, 0 if self.form == "columns" else None)) for pid in ranges}

    # ------------------------------------------------------------------ maintenance
    def optimize(self) -> None:
        """One commit that changes no rows (no cursor moves): a clustered table's files rewritten by
        `partition_id` (incrementally: clustered files stay), a partitioned table's small files of each
        partition bin-packed, a table of no layout's small files bin-packed in write order."""
        self.spark.sql(f"OPTIMIZE delta.`{self.path}`").collect()

    def vacuum(self, retention_hours: float, listing_parallelism: int) -> None:
        """Deletes the files no version of the last `retention_hours` uses (`maintenance.py` decides
        the retention), listing them with `listing_parallelism` Spark tasks. Logged in the Delta log
        as VACUUM START and VACUUM END."""
        settings = {_RETENTION_CHECK: "false", _VACUUM_LOGGING: "true", _LISTING_PARALLELISM: str(listing_parallelism)}
        previous: dict[str, str | None] = {key: self.spark.conf.get(key, None) for key in settings}
        for key, value in settings.items():
            self.spark.conf.set(key, value)
        try:
            self.spark.sql(f"VACUUM delta.`{self.path}` RETAIN {retention_hours:g} HOURS").collect()
        finally:  # the embedded server's session is shared by every client: leave it as it was
            for key, was in previous.items():
                if was is None:
                    self.spark.conf.unset(key)
                else:
                    self.spark.conf.set(key, was)

    # ------------------------------------------------------------------ progress notes
    def progress_folder(self, load_id: str) -> str | None:
        """Where a load's read tasks note what they read: beside a table on a local file system (a
        task writes it with plain file I/O, the run lists it); None elsewhere."""
        local = local_path(self.path)
        return str(Path(local) / PROGRESS_FOLDER / f"load-{load_id}") if local else None

    def remove_progress(self, folder: str | None) -> None:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)

    def _remove_abandoned_progress(self) -> None:
        local = local_path(self.path)
        notes = Path(local) / PROGRESS_FOLDER if local else None
        if notes is None or not notes.is_dir():
            return
        cutoff = time.time() - ABANDONED_AFTER_SECONDS
        for folder in notes.iterdir():
            with contextlib.suppress(OSError):
                if folder.stat().st_mtime < cutoff:
                    shutil.rmtree(folder)
