"""What a load tells Dagster, as typed sets of metadata: each set is written and read back by one
class (as dagster-dlt's `TableMetadataSet` is), so that a key is spelled once and a value read back
from Dagster's storage is the type it was written as. The keys are the ones
docs/getting-started/dagster-objects.md documents.

`PartitionMetadata` is each partition's materialization (the cursor of record and what the load
did), `SyncMetadata` the load's observation of the asset, `MaintenanceMetadata` the observation of a
maintenance; the checks' sets are in `checks.py`."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Self

import dagster as dg

# what a metadata dict may hold before Dagster normalizes it; dagster does not export the alias (and its
# module `__getattr__` lets mypy take `dg.RawMetadataValue` for Any)
from dagster._core.definitions.metadata import RawMetadataValue
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from feedapi_dagster.errors import StateError
from feedapi_dagster.lakehouse.load_report import LoadOutcome, LoadStatus, PartitionReport
from feedapi_dagster.planning.payload_columns import RESCUE_COLUMN
from feedapi_dagster.protocol import ProtocolError
from feedapi_dagster.protocol.models import FIRST

from .loads import SCHEDULED_SYNC, SYNC_TAG
from .translator import table_column_schema

if TYPE_CHECKING:
    from feedapi_dagster.lakehouse.maintenance import MaintenanceReport
    from feedapi_dagster.planning import PartitionState

    from .loads import FeedBinding


class UnreadableMetadata(StateError):
    """Metadata read back from Dagster's storage is not the set it should be (written by another
    version, or by hand)."""


class MetadataSet(BaseModel):
    """A set of metadata entries: a field per key (an alias where the key is not a name), written by
    `metadata()`, read back by `read()`. A field that is None is left out."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    def metadata(self) -> dict[str, RawMetadataValue]:
        return self.model_dump(by_alias=True, exclude_none=True)

    @classmethod
    def read(cls, metadata: Mapping[str, Any]) -> Self:
        """The set from an event's metadata (Dagster's `MetadataValue`s, or their values)."""
        values = {key: value.value if isinstance(value, dg.MetadataValue) else value for key, value in metadata.items()}
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            wrong = ", ".join(str(problem["loc"][0]) for problem in error.errors() if problem["loc"])
            raise UnreadableMetadata(f"metadata that is not a {cls.__name__} (keys {wrong})") from None


class PartitionMetadata(MetadataSet):
    """A partition's materialization: its cursor of record and what the load did, with Dagster's
    standard table keys (those of `dg.TableMetadataSet`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)  # `dg.TableSchema`

    status: str
    cursor: str
    position: int
    events: int
    pages: int
    duplicates_skipped: int
    # the partition's own read, from its first request to its checkpoint row, and the load's wall time
    # that read it (Spark's job, the write, the commits): no rate per partition, which said nothing
    # true of either
    read_seconds: float
    load_seconds: float
    drained: bool
    rebuilt: bool
    start_cursor: str
    protocol: str
    dialect: str | None = None
    delta_version: int  # -1: the table has no commit of the load's yet
    table_name: str = Field(alias="dagster/table_name")
    # the table's rows are the partitions' committed positions summed
    partition_row_count: int = Field(alias="dagster/partition_row_count")
    row_count: int = Field(alias="dagster/row_count")
    # a variant feed's (`payload_form: variant`) load: its rows whose payload Spark could not parse
    # (`data` NULL, the text in `payload`); the `payloads_parsed` check warns of them
    unparsed_payloads: int | None = None
    # a columns feed's load: its rows with values in `_rescued_data` (the `payloads_parsed` check warns of
    # them), the payload columns its commit added, and the table's columns after it
    rescued_values: int | None = None
    columns_added: list[str] | None = None
    column_schema: dg.TableSchema | None = Field(default=None, alias="dagster/column_schema")

    def metadata(self) -> dict[str, RawMetadataValue]:
        dumped = super().metadata()
        if self.column_schema is not None:  # pydantic dumps Dagster's NamedTuple as a plain tuple
            dumped["dagster/column_schema"] = self.column_schema
        return dumped

    @classmethod
    def of_report(cls, report: PartitionReport, outcome: LoadOutcome) -> Self:
        """What the load did to the partition; one it committed nothing for has the cursor and Delta
        version of the state."""
        version = report.delta_version if report.delta_version is not None else outcome.committed.delta_version
        return cls(
            status=_status(report),
            cursor=report.cursor,
            position=report.position,
            events=report.events,
            pages=report.pages,
            duplicates_skipped=report.duplicates,
            read_seconds=round(report.read_seconds, 3),
            load_seconds=round(report.load_seconds, 3),
            drained=report.drained,
            rebuilt=report.rebuilt,
            start_cursor=report.start_cursor,
            unparsed_payloads=report.unparsed_payloads,
            rescued_values=report.rescued_values,
            columns_added=list(report.columns_added) or None,
            **_schema_entry(outcome),
            **_table(outcome, report.position, version),
        )

    @classmethod
    def of_state(cls, state: PartitionState, outcome: LoadOutcome) -> Self:
        """The partition's cursor of record as Delta holds it, where the load did nothing to it."""
        return cls(
            status=_UP_TO_DATE,
            cursor=state.cursor,
            position=state.position,
            events=0,
            pages=0,
            duplicates_skipped=0,
            read_seconds=0.0,
            load_seconds=0.0,
            drained=state.drained,
            rebuilt=False,
            start_cursor=state.cursor,
            **_table(outcome, state.position, outcome.committed.delta_version),
        )

    def mirrors(self, state: PartitionState) -> bool:
        """Whether it says what Delta's cursor of record says of the partition."""
        return self.cursor == state.cursor and self.drained == state.drained


_UP_TO_DATE = "up to date: nothing new"


def _status(report: PartitionReport) -> str:
    if report.status is LoadStatus.LOADED:
        return "loaded" if report.delta_version is not None else _UP_TO_DATE
    if report.status is LoadStatus.WAITING:
        return f"waiting: {report.waiting_for}"  # the plan's reason (which parent it waits for)
    return report.status.value


def _table(outcome: LoadOutcome, position: int, version: int | None) -> dict[str, Any]:
    """The entries every partition's materialization shares: the feed's protocol, the table."""
    return {
        "protocol": outcome.info.protocol,
        "dialect": outcome.info.dialect or None,
        "delta_version": version if version is not None else -1,
        "table_name": outcome.table.path,
        "partition_row_count": position,
        "row_count": sum(p.position for p in outcome.committed.state.partitions.values()),
    }


def _schema_entry(outcome: LoadOutcome) -> dict[str, Any]:
    """A columns table's columns as the load's last write left them (none: it wrote none)."""
    table = outcome.table
    if table.form != "columns" or table.written_columns is None:
        return {}
    return {"dagster/column_schema": table_column_schema("columns", table.written_columns)}


def payload_warnings(feed: str, report: PartitionReport) -> list[str]:
    """The warnings of a load's partition whose rows have payloads Spark could not parse, or values in
    `_rescued_data` (the `payloads_parsed` check fails too): a producer whose payloads drift is noticed."""
    lines = []
    if report.unparsed_payloads:
        lines.append(
            f"feed {feed} partition {report.partition_id}: {report.unparsed_payloads} "
            f"{'payload' if report.unparsed_payloads == 1 else 'payloads'} Spark could not parse: loaded with data "
            "NULL, their text in payload"
        )
    if report.rescued_values:
        lines.append(
            f"feed {feed} partition {report.partition_id}: {report.rescued_values} "
            f"{'row has' if report.rescued_values == 1 else 'rows have'} values that have no column or do not fit "
            f"theirs: kept in {RESCUE_COLUMN}"
        )
    return lines


def materialized_reports(run: dg.DagsterRun, outcome: LoadOutcome, asked: Iterable[int]) -> list[PartitionReport]:
    """The partitions a run logs a materialization for: each it committed something for and, unless
    it is the schedule's sync, each of those it was asked for (`asked`) that it found up to date
    (a backfill's partitions succeed when they are materialized; the UI shows them so)."""
    if run.tags.get(SYNC_TAG) == SCHEDULED_SYNC:
        return [r for r in outcome.reports.values() if r.status is LoadStatus.LOADED and r.delta_version is not None]
    asked = set(asked)
    return [
        r
        for r in outcome.reports.values()
        if r.status.succeeded and (r.delta_version is not None or r.partition_id in asked)
    ]


def materializations(
    binding: FeedBinding, reports: Iterable[PartitionReport], outcome: LoadOutcome
) -> list[dg.AssetMaterialization]:
    """One materialization per report."""
    return [
        materialization(binding, str(report.partition_id), PartitionMetadata.of_report(report, outcome))
        for report in reports
    ]


def add_unknown_partitions(instance: dg.DagsterInstance, binding: FeedBinding, partition_ids: Iterable[int]) -> None:
    """Add to the asset's dynamic partitions those of `partition_ids` it does not have yet (partitions a
    stream found before the discovery sensor did): their materializations need keys."""
    known = set(instance.get_dynamic_partitions(binding.partitions_name))
    if new := sorted(str(pid) for pid in partition_ids if str(pid) not in known):
        instance.add_dynamic_partitions(binding.partitions_name, new)


def materialization(binding: FeedBinding, partition_key: str, metadata: PartitionMetadata) -> dg.AssetMaterialization:
    return dg.AssetMaterialization(binding.key, partition=partition_key, metadata=metadata.metadata())


def mirror_repairs(
    outcome: LoadOutcome, latest: Mapping[str, PartitionMetadata], skip: Iterable[int]
) -> dict[str, PartitionMetadata]:
    """The metadata, by partition key, of the partitions whose latest materialization (`latest`)
    disagrees with the cursor of record in Delta (a run killed between its commit and its
    materialization): the next run sets the mirror right."""
    skip = set(skip)
    repairs = {}
    for partition_id, state in sorted(outcome.committed.state.partitions.items()):
        if partition_id in skip or outcome.info.partition(partition_id) is None:
            continue
        mirrored = latest.get(str(partition_id))
        if mirrored is None or not mirrored.mirrors(state):
            repairs[str(partition_id)] = PartitionMetadata.of_state(state, outcome)
    return repairs


class SyncMetadata(MetadataSet):
    """The load's observation of the asset: when it synced, what it brought, and (where the protocol
    tells) how many events the feed holds past the cursors of record."""

    last_synced: float
    partitions_synced: int
    partitions_with_new_events: int
    partitions_failed: int
    events_loaded: int
    delta_version: int
    events_behind: int | None = None

    def metadata(self) -> dict[str, RawMetadataValue]:
        return {**super().metadata(), "last_synced": dg.MetadataValue.timestamp(self.last_synced)}


def sync_observation(
    binding: FeedBinding, outcome: LoadOutcome, logger: dg.DagsterLogManager | None = None
) -> dg.AssetObservation:
    """One observation of the asset per load, whatever its number of partitions."""
    reports = outcome.reports.values()
    version = outcome.committed.delta_version
    synced = SyncMetadata(
        last_synced=time.time(),
        partitions_synced=sum(r.status.succeeded for r in reports),
        partitions_with_new_events=sum(r.status is LoadStatus.LOADED and r.events > 0 for r in reports),
        partitions_failed=sum(not r.status.succeeded for r in reports),
        events_loaded=sum(r.events for r in reports if r.status is LoadStatus.LOADED),
        delta_version=version if version is not None else -1,
        events_behind=events_behind(binding, outcome, logger),
    )
    return dg.AssetObservation(binding.key, metadata=synced.metadata())


def events_behind(binding: FeedBinding, outcome: LoadOutcome, logger: dg.DagsterLogManager | None = None) -> int | None:
    """Events the feed holds past the cursors of record, summed over its partitions, from a discovery
    made now; None where the protocol cannot tell (FeedAPI) or the discovery failed."""
    state = outcome.committed.state
    client = binding.feed.client()
    try:
        if not client.protocol.tells_newest_events:
            return None
        partitions = client.discover().partitions
        cursors = {partition_id: own.cursor for partition_id, own in state.partitions.items()}
        counts = [client.protocol.events_behind(p, cursors.get(p.id, FIRST)) for p in partitions]
    except ProtocolError as error:
        if logger is not None:
            logger.warning("how far behind the feed the table is is unknown: discovery failed (%s)", error)
        return None
    finally:
        client.close()
    known = [count for count in counts if count is not None]
    return sum(known) if len(known) == len(counts) else None


class MaintenanceMetadata(MetadataSet):
    """The maintenance on the asset's page: what ran, the retention it used, the files it removed."""

    maintenance: str
    delta_version: int
    vacuum_retention_hours: float | None = None
    files_removed: int | None = None


def maintenance_observation(binding: FeedBinding, report: MaintenanceReport) -> dg.AssetObservation:
    maintained = MaintenanceMetadata(
        maintenance=", ".join(report.operations),
        delta_version=report.delta_version if report.delta_version is not None else -1,
        vacuum_retention_hours=report.retention_hours,
        files_removed=report.files_removed,
    )
    return dg.AssetObservation(binding.key, metadata=maintained.metadata())
