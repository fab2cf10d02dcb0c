"""`FeedDataSource`: a feed, in any protocol, as a PySpark data source named `feedapi`.

    spark.dataSource.register(FeedDataSource)
    spark.read.format("feedapi").option("url", url).load()   # every partition, `_first` to its end
    spark.read.format("feedapi").option("protocol", "nakadi").option("url", nakadi_url)
         .option("eventType", "shop.order-placed").load()   # a Nakadi event type, from BEGIN

Discovery runs once, where Spark plans the read (or not at all: a caller hands its own in
`discovery`). The feed partitions are spread over the read tasks by expected size
(`planning.task_groups`): a task reads its group a few partitions at a time with the protocol's
`FeedClient` (retries, truncated bodies, 409 and rediscovery included), streaming Arrow record batches
of about `GROUP_EVENTS` events (`read_tasks.py`): an executor holds one batch, not a partition. Options are
camelCase, as Spark's own sources:

* the feed: the fields of its protocol's settings model, camelCase, JSON for the nested ones, and
  nothing else (an option no field has is refused). Every protocol's: `url` (required), `protocol`
  (a registered one: feedapi, the default, nakadi, or a user's), `pageSizeHint`, `eventIdField` (the
  payload field stored as `event_id`, dotted when nested), `retry` (JSON of `RetryPolicy`), `caBundle`,
  `verify` (false turns TLS verification off); FeedAPI's `dialect` (auto|v1|draft|published),
  `partitionCount` (v1), `filters` (JSON of `EventFilter`); Nakadi's `eventType`;
* `protocolModule`: the module that registers a protocol that is not built in (`spark_options` writes
  it). Spark parses the options in its Python workers (forked ones of a local session, a Spark Connect
  server's own), where the user's module may not have been imported: it is imported there first (a
  Connect session's workers have its package from the load: `registration.register_feed_source`);
* the bearer token: `tokenEnv`, an environment variable of the executors, or `token`. Spark redacts
  options whose key contains "token" from plans and its UI; the value is also kept out of this
  source's reprs and errors.
* incremental reads: `partitions` (comma-separated ids; default all), `startCursors` and
  `startPositions` (JSON objects by partition id: where each partition resumes and the position its
  first new event gets; default `_first` and 0), `maxEvents` (a bound per partition: its read stops
  at the first checkpoint at or past it);
* `checkpointRows` (true|false): each partition's read ends with one row holding where it stopped
  (see `END_COLUMN`), what the lakehouse loader commits as the partition's cursor; in a stream, each
  micro-batch has one row holding its start and end offsets, what `FeedStream` commits;
* streams only (`stream_source.py`): `maxEventsPerTrigger`, `dedupWindow`, `startOffset` (JSON of a
  `StreamOffset`: where a query without a checkpoint starts);
* `tasks` (read tasks, 16 by default; the expected size of a partition is its start position),
  `threadsPerTask` (8), `discovery` (JSON of a `FeedInfo`: the tasks use it instead of discovering),
  `progressFolder` (a local folder where each task notes what it read when it ends).

Protocol failures that survive the client's retries end a partition's read early with the error in
its checkpoint row when `checkpointRows` is on (the rows read before it are good), and fail the query
otherwise.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from feedapi_dagster.planning import task_groups
from feedapi_dagster.protocol import FeedClient, FeedInfo, FeedSettings, ProtocolError, feed_settings
from feedapi_dagster.protocol.models import FIRST
from feedapi_dagster.protocol.registry import DEFAULT_PROTOCOL, import_protocol, protocol_module, registered_protocols
from feedapi_dagster.read.read_tasks import END_COLUMN, GroupRead, PartitionStart, ReadSettings
from feedapi_dagster.read.rows import EVENT_SCHEMA, check_id_field, spark_ddl
from feedapi_dagster.read.stream_source import (
    DEDUP_WINDOW,
    DEFAULT_DEDUP_WINDOW,
    MAX_EVENTS_PER_TRIGGER,
    START_OFFSET,
    STREAM_OPTIONS,
    FeedStreamReader,
    StreamOffset,
)

SOURCE_NAME = "feedapi"
EVENT_DDL = spark_ddl(EVENT_SCHEMA)


PROTOCOL_MODULE = "protocolModule"
# the options of a read, beside the feed's settings
_READ_OPTIONS = frozenset(
    {
        "partitions",
        "startcursors",
        "startpositions",
        "maxevents",
        "checkpointrows",
        "discovery",
        "tasks",
        "threadspertask",
        "progressfolder",
        PROTOCOL_MODULE.lower(),
    }
    | STREAM_OPTIONS
)


@dataclass(frozen=True)
class FeedSourceOptions:
    """One read: the feed (its protocol's settings, whose fields are the options `url`,
    `pageSizeHint`...) and what to read of it. Parsed and checked where Spark plans the read."""

    feed: FeedSettings
    partitions: tuple[int, ...] | None = None
    start_cursors: dict[int, str] = field(default_factory=dict)
    start_positions: dict[int, int] = field(default_factory=dict)
    max_events: int | None = None
    checkpoint_rows: bool = False
    discovery: FeedInfo | None = None
    tasks: int | None = None
    threads_per_task: int = 8
    progress_folder: str | None = None

    def __repr__(self) -> str:  # the token stays out of anything printed
        return f"FeedSourceOptions({self.feed!r}, partitions={self.partitions})"

    @classmethod
    def parse(cls, options: dict[str, str]) -> FeedSourceOptions:
        # Spark hands options with lower-cased keys (a case-insensitive map)
        get = {key.lower(): value for key, value in options.items()}.get
        if not get("url"):
            raise ValueError("the feedapi data source needs the option `url`")
        try:
            feed = _feed(get, options)
            check_id_field(feed.event_id_field)
            partitions = get("partitions")
            return cls(
                feed=feed,
                partitions=None if partitions is None else tuple(int(p) for p in partitions.split(",") if p.strip()),
                start_cursors={int(k): str(v) for k, v in json.loads(get("startcursors", "{}")).items()},
                start_positions={int(k): int(v) for k, v in json.loads(get("startpositions", "{}")).items()},
                max_events=_int(get("maxevents")),
                checkpoint_rows=get("checkpointrows", "false").lower() == "true",
                discovery=FeedInfo.model_validate_json(discovery) if (discovery := get("discovery")) else None,
                tasks=_int(get("tasks")),
                threads_per_task=_int(get("threadspertask")) or 8,
                progress_folder=get("progressfolder"),
            )
        except ValidationError as error:
            problems = "; ".join(
                f"{to_camel(str(e['loc'][0])) if e['loc'] else 'options'}: {e['msg']}"
                for e in error.errors(include_url=False, include_input=False)
            )
            raise ValueError(f"feedapi data source: bad option: {problems}") from None
        except (ValueError, TypeError) as error:
            raise ValueError(f"feedapi data source: bad option: {error}") from None

    def spark_options(self) -> dict[str, str]:
        """This read as Spark options (`spark.read.format("feedapi").options(**...)`)."""
        feed = self.feed.model_dump(mode="json", exclude_defaults=True, exclude_none=True)
        if self.feed.token is not None:  # dumped as "**********"
            feed["token"] = self.feed.token.get_secret_value()
        fields = type(self.feed).model_fields
        options: dict[str, object] = {
            to_camel(name): json.dumps(value) if _nested(fields[name]) else value for name, value in feed.items()
        }
        options |= {
            "protocol": self.feed.protocol,
            PROTOCOL_MODULE: protocol_module(self.feed.protocol),
            "partitions": ",".join(map(str, self.partitions)) if self.partitions is not None else None,
            "startCursors": json.dumps({str(k): v for k, v in self.start_cursors.items()})
            if self.start_cursors
            else None,
            "startPositions": json.dumps({str(k): v for k, v in self.start_positions.items()})
            if self.start_positions
            else None,
            "maxEvents": self.max_events,
            "checkpointRows": self.checkpoint_rows or None,
            "discovery": self.discovery.model_dump_json() if self.discovery else None,
            "tasks": self.tasks,
            "threadsPerTask": self.threads_per_task if self.threads_per_task != 8 else None,
            "progressFolder": self.progress_folder,
        }
        return {
            key: str(value).lower() if isinstance(value, bool) else str(value)
            for key, value in options.items()
            if value is not None
        }

    def client(self, info: FeedInfo | None = None) -> FeedClient:
        return FeedClient(self.feed, info=info)

    def read_settings(self) -> ReadSettings:
        return ReadSettings(
            self.feed.event_id_field, self.checkpoint_rows, self.max_events, self.threads_per_task, self.progress_folder
        )


def _feed(get: typing.Callable[[str], str | None], options: dict[str, str]) -> FeedSettings:
    """The feed's settings from its options, through the registry into its protocol's model."""
    module = get(PROTOCOL_MODULE.lower())
    if module:
        try:
            import_protocol(module)
        except ProtocolError as error:
            raise ValueError(f"{PROTOCOL_MODULE}: {error}") from None
    name = get("protocol") or DEFAULT_PROTOCOL
    protocol = registered_protocols().get(name)
    if protocol is None:
        return feed_settings(protocol=name)  # the error that lists the registered protocols
    fields = protocol.settings.model_fields
    by_option = {to_camel(field).lower(): field for field in fields}
    unknown = sorted(key for key in options if key.lower() not in by_option and key.lower() not in _READ_OPTIONS)
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not a setting of protocol {name} nor of a read")
    return feed_settings(
        {
            field: json.loads(value) if _nested(fields[field]) else value
            for option, field in by_option.items()
            if (value := get(option)) is not None
        }
    )


def _nested(field: FieldInfo) -> bool:
    """Whether a settings field's option is JSON: a model, or a collection."""
    kinds = typing.get_args(field.annotation) or (field.annotation,)
    return any(
        isinstance(kind, type)
        and issubclass(kind, (BaseModel, dict, list, tuple))
        or typing.get_origin(kind) in (dict, list, tuple)
        for kind in kinds
    )


def _int(value: str | None) -> int | None:
    return None if value in (None, "") else int(value)


class FeedPartitionGroup(InputPartition):
    """The feed partitions of one task, where each resumes, and the discovery they were planned from
    (only theirs): the task reads with it instead of discovering again."""

    def __init__(self, index: int, info: FeedInfo, starts: list[PartitionStart]):
        super().__init__(index)
        self.info = info
        self.starts = starts

    def __repr__(self) -> str:
        return f"FeedPartitionGroup({[s.partition_id for s in self.starts]})"


class FeedDataSource(DataSource):
    """A feed as a Spark data source: `spark.read.format("feedapi")`. See the module docstring."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        if FeedSourceOptions.parse(dict(self.options)).checkpoint_rows:
            return f"{EVENT_DDL}, {END_COLUMN} STRING"
        return EVENT_DDL

    def reader(self, schema: StructType) -> FeedReader:
        return FeedReader(FeedSourceOptions.parse(dict(self.options)))

    def streamReader(self, schema: StructType) -> FeedStreamReader:
        """`spark.readStream.format("feedapi")`: see `stream_source.py`."""
        options = FeedSourceOptions.parse(dict(self.options))
        get = {key.lower(): value for key, value in self.options.items()}.get
        try:
            limit = _int(get(MAX_EVENTS_PER_TRIGGER.lower()))
            window = _int(get(DEDUP_WINDOW.lower()))
            start = StreamOffset.from_json(json.loads(text)) if (text := get(START_OFFSET.lower())) else None
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(f"feedapi data source: bad option: {error}") from None
        if limit is not None and limit < 1:
            raise ValueError(f"feedapi data source: bad option: {MAX_EVENTS_PER_TRIGGER} must be at least 1")
        return FeedStreamReader(options, limit, DEFAULT_DEDUP_WINDOW if window is None else window, start)


class FeedReader(DataSourceReader):
    def __init__(self, options: FeedSourceOptions):
        self.options = options

    def partitions(self) -> list[FeedPartitionGroup]:
        options = self.options
        info = options.discovery
        if info is None:
            with options.client() as client:
                info = client.discover()
        wanted = options.partitions if options.partitions is not None else [p.id for p in info.partitions]
        cursors, positions = options.start_cursors, options.start_positions
        # the expected size of a partition: the rows it holds (its start position), a proxy for its traffic
        groups = task_groups({pid: positions.get(pid, 0) for pid in wanted}, options.tasks)
        # Spark needs at least one input partition; an empty selection reads nothing
        return [
            FeedPartitionGroup(
                index,
                info.only(group),
                [PartitionStart(pid, cursors.get(pid, FIRST), positions.get(pid, 0)) for pid in group],
            )
            for index, group in enumerate(groups)
        ] or [FeedPartitionGroup(0, info.only([]), [])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FeedPartitionGroup)  # what `partitions` made
        yield from GroupRead(
            self.options.read_settings(), self.options.client, partition.info, partition.starts
        ).batches()
