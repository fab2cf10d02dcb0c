"""`FeedDataSource`: a FeedAPI feed as a PySpark data source named `feedapi`.

    spark.dataSource.register(FeedDataSource)
    spark.read.format("feedapi").option("url", url).load()   # every partition, `_first` to its end

Discovery runs once, where Spark plans the read; each feed partition becomes one input partition, and
a Spark task pages through it with the protocol's `FeedClient` (retries, truncated bodies, 409 and
rediscovery included), streaming Arrow record batches of about `GROUP_EVENTS` events: an executor
holds one batch, not a partition. Options are camelCase, as Spark's own sources:

* `url` (required), `dialect` (auto|v1|draft|published), `partitionCount` (v1), `pageSizeHint`,
  `eventIdField` (the payload field stored as `event_id`), `filters` and `retry` (JSON of
  `EventFilter` / `RetryPolicy`), `caBundle`, `verify` (false turns TLS verification off);
* the bearer token: `tokenEnv`, an environment variable of the executors, or `token`. Spark redacts
  options whose key contains "token" from plans and its UI; the value is also kept out of this
  source's reprs and errors.
* incremental reads: `partitions` (comma-separated ids; default all), `startCursors` and
  `startPositions` (JSON objects by partition id: where each partition resumes and the position its
  first new event gets; default `_first` and 0), `maxEvents` (a bound per task: it stops at the
  first checkpoint at or past it);
* `checkpointRows` (true|false): each task ends with one row holding where it stopped (see
  `END_COLUMN`), what the lakehouse loader commits as the partition's cursor.

Protocol failures that survive the client's retries end a task early with the error in its
checkpoint row when `checkpointRows` is on (the rows read before it are good), and fail the query
otherwise.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from feedapi_dagster.protocol import (EventFilter, FeedAPIError, FeedClient, FeedInfo, PageRun,
                                      RediscoveryNeeded, RetryPolicy)
from feedapi_dagster.protocol.models import FIRST

from .table import EVENT_SCHEMA, EventBatch, check_id_field, event_ids, spark_ddl

SOURCE_NAME = "feedapi"
# The column of a task's checkpoint row (`checkpointRows`): JSON of `ReadEnd`; NULL on event rows.
END_COLUMN = "read_end"
# Events (or payload bytes) per Arrow batch a task hands Spark.
GROUP_EVENTS = 10_000
GROUP_BYTES = 8 * 1024 * 1024
_MAX_REDISCOVERIES = 3
EVENT_DDL = spark_ddl(EVENT_SCHEMA)


@dataclass(frozen=True)
class ReadEnd:
    """Where a task stopped reading one partition: the checkpoint row's `read_end`, with the row's
    `position` (the next event's) and `cursor` (the resume point)."""

    events: int
    pages: int
    duplicates: int
    drained: bool  # closed (or a `_done` checkpoint) and read to its end
    bounded: bool = False  # stopped at `maxEvents`: there may be more
    error: str | None = None
    seconds: float = 0.0  # the task's own reading time (its events/s in the run's log)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "ReadEnd":
        return cls(**json.loads(text))


@dataclass(frozen=True)
class FeedSourceOptions:
    """The options of one read, parsed and checked where Spark plans it."""

    url: str
    dialect: str = "auto"
    partition_count: int | None = None
    page_size_hint: int | None = 1000
    event_id_field: str = "id"
    event_filter: EventFilter | None = None
    retry: RetryPolicy | None = None
    verify: bool | str = True
    token_env: str | None = None
    token: str | None = None
    partitions: tuple[int, ...] | None = None
    start_cursors: dict[int, str] | None = None
    start_positions: dict[int, int] | None = None
    max_events: int | None = None
    checkpoint_rows: bool = False

    def __repr__(self) -> str:  # the token stays out of anything printed
        return f"FeedSourceOptions(url={self.url!r}, dialect={self.dialect!r}, partitions={self.partitions})"

    @classmethod
    def parse(cls, options: dict[str, str]) -> "FeedSourceOptions":
        # Spark hands options with lower-cased keys (a case-insensitive map)
        get = {key.lower(): value for key, value in options.items()}.get
        url = get("url")
        if not url:
            raise ValueError("the feedapi data source needs the option `url`")
        try:
            partitions = get("partitions")
            verify = get("cabundle") or get("verify", "true")
            return cls(
                url=url,
                dialect=get("dialect", "auto"),
                partition_count=_int(get("partitioncount")),
                page_size_hint=_int(get("pagesizehint", "1000")),
                event_id_field=check_id_field(get("eventidfield", "id")),
                event_filter=EventFilter.model_validate_json(get("filters")) if get("filters") else None,
                retry=RetryPolicy.model_validate_json(get("retry")) if get("retry") else None,
                verify=verify if get("cabundle") else verify.lower() != "false",
                token_env=get("tokenenv"),
                token=get("token"),
                partitions=None if partitions is None else tuple(int(p) for p in partitions.split(",") if p.strip()),
                start_cursors={int(k): str(v) for k, v in json.loads(get("startcursors", "{}")).items()},
                start_positions={int(k): int(v) for k, v in json.loads(get("startpositions", "{}")).items()},
                max_events=_int(get("maxevents")),
                checkpoint_rows=get("checkpointrows", "false").lower() == "true",
            )
        except (ValueError, TypeError) as error:
            raise ValueError(f"feedapi data source: bad option: {error}") from None

    def spark_options(self, *, partitions: list[int] | None = None, start_cursors: dict[int, str] | None = None,
                      start_positions: dict[int, int] | None = None, max_events: int | None = None,
                      checkpoint_rows: bool = False) -> dict[str, str]:
        """The Spark options of a read of this feed (`spark.read.format("feedapi").options(**...)`)."""
        options = {
            "url": self.url, "dialect": self.dialect, "partitionCount": self.partition_count,
            "pageSizeHint": self.page_size_hint, "eventIdField": self.event_id_field,
            "filters": self.event_filter.model_dump_json() if self.event_filter else None,
            "retry": self.retry.model_dump_json() if self.retry else None,
            "caBundle": self.verify if isinstance(self.verify, str) else None,
            "verify": None if isinstance(self.verify, str) else self.verify,
            "tokenEnv": self.token_env, "token": self.token,
            "partitions": ",".join(map(str, partitions)) if partitions is not None else None,
            "startCursors": json.dumps({str(k): v for k, v in start_cursors.items()}) if start_cursors else None,
            "startPositions": json.dumps({str(k): v for k, v in start_positions.items()}) if start_positions else None,
            "maxEvents": max_events, "checkpointRows": checkpoint_rows,
        }
        return {key: str(value).lower() if isinstance(value, bool) else str(value)
                for key, value in options.items() if value is not None}

    def client(self) -> FeedClient:
        token = self.token
        if self.token_env:
            token = os.environ.get(self.token_env)
            if not token:
                raise FeedAPIError(f"feedapi data source: environment variable {self.token_env} (tokenEnv) "
                                   "is not set where the read runs")
        return FeedClient(self.url, dialect=self.dialect, partition_count=self.partition_count, token=token,
                          page_size_hint=self.page_size_hint, event_filter=self.event_filter, retry=self.retry,
                          verify=self.verify)


def _int(value: str | None) -> int | None:
    return None if value in (None, "") else int(value)


class FeedPartition(InputPartition):
    """One feed partition for one task: where it resumes and what discovery said of it."""

    def __init__(self, partition_id: int, cursor: str, position: int):
        super().__init__(partition_id)
        self.partition_id = partition_id
        self.cursor = cursor
        self.position = position

    def __repr__(self) -> str:
        return f"FeedPartition({self.partition_id}, cursor={self.cursor!r}, position={self.position})"


class FeedDataSource(DataSource):
    """FeedAPI as a Spark data source: `spark.read.format("feedapi")`. See the module docstring."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        if FeedSourceOptions.parse(dict(self.options)).checkpoint_rows:
            return f"{EVENT_DDL}, {END_COLUMN} STRING"
        return EVENT_DDL

    def reader(self, schema: StructType) -> "FeedReader":
        return FeedReader(FeedSourceOptions.parse(dict(self.options)))


class FeedReader(DataSourceReader):
    def __init__(self, options: FeedSourceOptions):
        self.options = options
        self._info: FeedInfo | None = None

    def partitions(self) -> list[FeedPartition]:
        options = self.options
        with options.client() as client:
            info = self._info = client.discover()
        wanted = options.partitions if options.partitions is not None else [p.id for p in info.partitions]
        cursors, positions = options.start_cursors or {}, options.start_positions or {}
        # Spark needs at least one input partition; an empty selection reads nothing from partition -1
        return [FeedPartition(pid, cursors.get(pid, FIRST), positions.get(pid, 0)) for pid in wanted] or \
            [FeedPartition(-1, FIRST, 0)]

    def read(self, partition: FeedPartition) -> Iterator[pa.RecordBatch]:
        if partition.partition_id < 0:
            return
        yield from PartitionRead(self.options, partition).batches()


class PartitionRead:
    """One task: the pages of one partition from its start cursor, as Arrow record batches."""

    def __init__(self, options: FeedSourceOptions, partition: FeedPartition):
        self.options = options
        self.partition_id = partition.partition_id
        self.cursor = partition.cursor
        self.position = partition.position
        self.events = self.pages = self.duplicates = 0
        self._fetched = 0  # events fetched, duplicates included (what `maxEvents` bounds)
        self.done = False
        # an at-least-once feed repeats events: ids seen in this read are dropped (ids stored by
        # earlier loads are the loader's business, in Spark)
        self._seen: set[bytes] | None = None

    def batches(self) -> Iterator[pa.RecordBatch]:
        options = self.options
        schema = _schema(options.checkpoint_rows)
        started = time.monotonic()
        error, closed = None, False
        try:
            with options.client() as client:
                info = client.discover()
                if not info.exactly_once:
                    self._seen = set()
                partition = info.partition(self.partition_id)
                closed = partition is not None and partition.closed
                for runs in self._run_groups(client):
                    yield self._batch(runs, schema)
        except FeedAPIError as failure:
            if not options.checkpoint_rows:
                raise
            error = str(failure)
        if options.checkpoint_rows:
            drained = error is None and (self.done or (closed and not self._bounded))
            end = ReadEnd(self.events, self.pages, self.duplicates, drained, self._bounded and not drained, error,
                          round(time.monotonic() - started, 3))
            yield pa.RecordBatch.from_pydict({
                "partition_id": [self.partition_id], "position": [self.position], "cursor": [self.cursor],
                "payload": [None], "payload_type": [None], "event_id": [None], END_COLUMN: [end.to_json()],
            }, schema=schema)

    @property
    def _bounded(self) -> bool:
        return self.options.max_events is not None and self._fetched >= self.options.max_events

    def _run_groups(self, client: FeedClient) -> Iterator[list[PageRun]]:
        """Page runs in groups of about `GROUP_EVENTS` events or `GROUP_BYTES` bytes; what was read
        before an error is yielded before the error is raised (it is good: it gets committed)."""
        runs: list[PageRun] = []
        count = size = 0
        try:
            for run in self._runs(client):
                runs.append(run)
                count += len(run.raw_events)
                self._fetched += len(run.raw_events)
                size += run.payload_bytes
                if count >= GROUP_EVENTS or size >= GROUP_BYTES:
                    yield runs
                    runs, count, size = [], 0, 0
                if self._bounded:
                    break
        except Exception:
            if runs:
                yield runs
            raise
        if runs:
            yield runs

    def _runs(self, client: FeedClient) -> Iterator[PageRun]:
        cursor = self.cursor  # of the last run read (runs are batched later: `self.cursor` lags)
        for attempt in range(1, _MAX_REDISCOVERIES + 2):
            try:
                for run in client.page_runs(self.partition_id, cursor):
                    yield run
                    cursor = run.cursor
                return
            except RediscoveryNeeded:
                # the discovery token changed (published dialect): discover again and go on from the
                # last cursor, unless the partition vanished in a method-2 split
                if attempt > _MAX_REDISCOVERIES:
                    raise
                if client.discover().partition(self.partition_id) is None:
                    return

    def _batch(self, runs: list[PageRun], schema: pa.Schema) -> pa.RecordBatch:
        batch = EventBatch(self.options.event_id_field)
        for run in runs:
            raws, ends = run.raw_events, run.ends
            if self._seen is not None:
                raws, ends = _unseen(raws, ends, event_ids(raws, self.options.event_id_field), self._seen)
                self.duplicates += len(run.raw_events) - len(raws)
            batch.add(run.partition_id, self.position, raws, ends, run.cursors)
            self.position += len(raws)
            self.events += len(raws)
            self.pages += len(run.ends)
            self.cursor = run.cursor
            self.done = self.done or run.done
        rows = batch.to_arrow()
        if END_COLUMN in schema.names:
            rows = rows.append_column(END_COLUMN, pa.nulls(rows.num_rows, pa.string()))
        return rows.combine_chunks().to_batches()[0] if rows.num_rows else pa.RecordBatch.from_pylist([], schema)


def _schema(checkpoint_rows: bool) -> pa.Schema:
    return EVENT_SCHEMA.append(pa.field(END_COLUMN, pa.string())) if checkpoint_rows else EVENT_SCHEMA


def _unseen(raws: list[bytes], ends: list[int], ids: list[bytes | None],
            seen: set[bytes]) -> tuple[list[bytes], list[int]]:
    """The events whose id was not seen (adding theirs), and the pages' new ends."""
    kept: list[bytes] = []
    kept_ends: list[int] = []
    start = 0
    for end in ends:
        for raw, event_id in zip(raws[start:end], ids[start:end]):
            if event_id is not None:
                if event_id in seen:
                    continue
                seen.add(event_id)
            kept.append(raw)
        kept_ends.append(len(kept))
        start = end
    return kept, kept_ends
