"""Prototypes of proposed sink/loader changes, applied by monkeypatching in the benchmark process only.

`bench_sink.py --variant NAME` measures one end to end without touching the package; they are not
production code (no error handling beyond what a benchmark needs):

* ``coalesce-pages``: `PageReader` yields one `Page` per decoded block (the last checkpoint of the
  block covers every event before it) instead of one per checkpoint. The demo feed checkpoints every
  1-5 events, so a 1M-event load makes ~330k pages: ~330k queue hand-offs, `_add_page` calls and
  pydantic `model_copy`s, and the loader's `queued_pages=64` buffers only ~200 events, so fetching
  stalls while a batch is written.
* ``parquet-handoff``: the batch reaches Spark as Parquet files written by pyarrow into a staging dir
  (same file system: embedded / local mode) and read with `spark.read.parquet`, instead of
  `createDataFrame(arrow)` (a Connect LocalRelation: Arrow IPC in the plan, turned into rows in the
  driver, shipped to one task, sorted and written there).
* ``python-derive``: payload type, event id and the value of string payloads are computed in Python
  (msgspec) instead of per-row `get_json_object` in the JVM. Prototype: the event id of non-string
  ids is the raw JSON text, which matches get_json_object for numbers but not for every JSON value.
* ``deltars-write``: rows (derived in Python as above) are appended by delta-rs (`deltalake`, the
  test extra's Delta reader/writer: Rust, no JVM) in one commit that carries the same userMetadata
  and the txn action; Spark still creates the table and reads state and rows. Prototype only: delta-rs
  records the txn but does not skip an already-used txnVersion as Delta Spark does, so the sink's
  protection against two concurrent writers would need another mechanism; replaceWhere (rebuilds) and
  staged unions are not covered.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

VARIANTS = ("coalesce-pages", "parquet-handoff", "python-derive", "deltars-write")


def apply(names: Iterable[str], staging_root: Path) -> Callable[[], None]:
    """Apply the named variants; returns a function that undoes them."""
    names = set(names)
    unknown = names - set(VARIANTS)
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}; known: {VARIANTS}")
    undo: list[Callable[[], None]] = []
    if "coalesce-pages" in names:
        undo.append(_patch_page_reader())
    if "deltars-write" in names:
        undo.append(_patch_deltars_write())
    elif names & {"parquet-handoff", "python-derive"}:
        undo.append(_patch_rows_frame(staging_root if "parquet-handoff" in names else None,
                                      "python-derive" in names))

    def restore() -> None:
        for fn in reversed(undo):
            fn()
    return restore


# ----------------------------------------------------------------------------- coalesce-pages
def _patch_page_reader() -> Callable[[], None]:
    from feedapi_dagster.protocol import ndjson
    from feedapi_dagster.protocol.models import DONE_CURSORS, Page

    original = ndjson.PageReader._take

    def take_coalesced(self, lines: Iterable) -> Iterator[Page]:
        key = self.event_key
        events = self._events
        cursor_seen, covered = None, 0
        for line in lines:
            raw = getattr(line, key)
            if raw is not msgspec.UNSET:
                payload = bytes(raw)
                events.append(payload)
                if self.max_page_bytes is not None:
                    self._page_bytes += len(payload)
                    self._check_bound(self._page_bytes)
                continue
            cursor = line.cursor
            if cursor is None:
                continue
            cursor = str(cursor)
            if cursor in DONE_CURSORS:
                if cursor_seen is not None:
                    yield Page(self.partition_id, events[:covered], cursor_seen)
                    events = events[covered:]
                self._events, self._page_bytes = [], 0
                yield Page(self.partition_id, events, "", done=True)
                return
            cursor_seen, covered = cursor, len(events)
        if cursor_seen is not None:
            rest = events[covered:]
            del events[covered:]
            self._events = rest
            self._page_bytes = sum(map(len, rest))
            yield Page(self.partition_id, events, cursor_seen)

    ndjson.PageReader._take = take_coalesced
    return lambda: setattr(ndjson.PageReader, "_take", original)


# ----------------------------------------------------------------------------- rows_frame variants
class _FrameSource:
    """Stands in for the session in `table.rows_frame`, whose createDataFrame then returns `frame`,
    so that the exact same column expressions run over another source."""

    def __init__(self, frame) -> None:
        self.frame = frame

    def createDataFrame(self, *args, **kwargs):  # noqa: N802 - Spark's name
        return self.frame


class _Id(msgspec.Struct):
    id: msgspec.Raw = msgspec.UNSET


_KINDS = {ord("{"): "object", ord('"'): "string", ord("["): "array", ord("t"): "boolean", ord("f"): "boolean",
          ord("n"): "null"}


def derive(batch: pa.Table, event_id_field: str) -> pa.Table:
    """`batch` plus string_value, payload_type and event_id, computed with msgspec."""
    decoder = msgspec.json.Decoder(msgspec.defstruct("Id", [(event_id_field, msgspec.Raw, msgspec.UNSET)]))
    ids, strings, kinds = [], [], []
    for text in batch.column("raw").to_pylist():
        raw = text.encode()
        first = raw[0]
        kinds.append(_KINDS.get(first, "number"))
        if first == 123:  # {
            value = getattr(decoder.decode(raw), event_id_field)
            if value is msgspec.UNSET:
                ids.append(None)
            else:
                value = bytes(value)
                ids.append(msgspec.json.decode(value) if value[:1] == b'"' else value.decode())
            strings.append(None)
        else:
            ids.append(None)
            strings.append(msgspec.json.decode(raw) if first == 34 else None)
    return (batch.append_column("string_value", pa.array(strings, pa.string()))
            .append_column("payload_type", pa.array(kinds, pa.string()))
            .append_column("event_id", pa.array(ids, pa.string())))


def _patch_rows_frame(staging_root: Path | None, python_derive: bool) -> Callable[[], None]:
    from feedapi_dagster.lakehouse import sink

    original = sink.rows_frame
    counter = itertools.count()

    def source(spark, batch: pa.Table):
        if staging_root is None:
            return spark.createDataFrame(batch)
        directory = staging_root / f"batch-{next(counter):05d}"
        directory.mkdir(parents=True)
        # two files: one read task per core
        step = -(-batch.num_rows // 2)
        for index in range(2):
            pq.write_table(batch.slice(index * step, step), directory / f"part-{index}.parquet",
                           compression="none")
        return spark.read.parquet(str(directory))

    def rows_frame(spark, batch: pa.Table, event_id_field: str, run_id: str | None):
        if not batch.num_rows:
            return original(spark, batch, event_id_field, run_id)
        if not python_derive:
            return original(_FrameSource(source(spark, batch)), batch, event_id_field, run_id)
        from pyspark.sql import functions as F

        frame = source(spark, derive(batch, event_id_field))
        return frame.select(
            F.col("partition_id"), F.col("position"), F.col("cursor"),
            F.coalesce(F.col("string_value"), F.col("raw")).alias("payload"),
            F.col("payload_type"), F.col("event_id"),
            F.current_timestamp().alias("loaded_at"),
            F.lit(run_id).cast("string").alias("run_id"),
        )

    sink.rows_frame = rows_frame
    return lambda: setattr(sink, "rows_frame", original)



# ----------------------------------------------------------------------------- deltars-write
_ARROW_ROWS = pa.schema([
    ("partition_id", pa.int32()), ("position", pa.int64()), ("cursor", pa.string()), ("payload", pa.string()),
    ("payload_type", pa.string()), ("event_id", pa.string()), ("loaded_at", pa.timestamp("us", tz="UTC")),
    ("run_id", pa.string()),
])


def _patch_deltars_write() -> Callable[[], None]:
    import datetime as dt

    import pyarrow.compute as pc
    from deltalake import CommitProperties, Transaction, write_deltalake

    from feedapi_dagster.lakehouse import sink, state as committed

    original_rows_frame, original_write = sink.rows_frame, sink.DeltaSink._write

    def rows_frame(spark, batch: pa.Table, event_id_field: str, run_id: str | None):
        rows = derive(batch, event_id_field)
        count = rows.num_rows
        now = pa.scalar(dt.datetime.now(dt.timezone.utc), pa.timestamp("us", tz="UTC"))
        return pa.Table.from_arrays([
            rows.column("partition_id"), rows.column("position"), rows.column("cursor"),
            pc.coalesce(rows.column("string_value"), rows.column("raw")),
            rows.column("payload_type"), rows.column("event_id"),
            pa.repeat(now, count) if count else pa.array([], now.type),
            pa.nulls(count, pa.string()) if run_id is None else pa.repeat(pa.scalar(run_id), count),
        ], schema=_ARROW_ROWS)

    def write(self, frame, state, commit_id: str, replace: list[int]) -> None:
        if not isinstance(frame, pa.Table) or replace:
            raise NotImplementedError("deltars-write prototype: plain appends only")
        write_deltalake(self.path, frame, mode="append", commit_properties=CommitProperties(
            custom_metadata={"userMetadata": committed.encode(state, commit_id, self.run_id)},
            app_transactions=[Transaction(committed.TXN_APP_ID, state.generation)]))

    sink.rows_frame, sink.DeltaSink._write = rows_frame, write

    def restore() -> None:
        sink.rows_frame, sink.DeltaSink._write = original_rows_frame, original_write
    return restore
