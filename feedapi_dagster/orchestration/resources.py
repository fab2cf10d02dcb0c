"""The Dagster resources of the feeds. `FeedApiResource` runs a feed's load for a run's partitions and
its table's maintenance, by Spark, as dagster-dlt's `DagsterDltResource.run(context)` runs a pipeline
and dagster-sling's `SlingResource.replicate(context)` a replication; `SparkResource` is the Spark
session it uses unless given another, made from the project's `SparkSettings`."""

import atexit
import gc
from collections.abc import Generator, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field, PrivateAttr, field_validator

from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.lakehouse.load_report import LoadOutcome, LoadStatus
from feedapi_dagster.lakehouse.loader import FeedLoader
from feedapi_dagster.lakehouse.maintenance import due, maintain
from feedapi_dagster.spark.connect_server import port_open
from feedapi_dagster.spark.sessions import spark_session
from feedapi_dagster.spark.settings import SparkSettings
from feedapi_dagster.spark.watchdog import DEFAULT_UNRESPONSIVE_SECONDS, answering, is_connect

from .checks import CheckedLoad, feed_check_results
from .dead_streams import RUNNING, STREAM_QUERY_TAG, Logger, clear_dead_streams, mark_query_stopped
from .loads import (
    BACKFILL_TAG,
    FEED_TAG,
    REBUILD_TAG,
    FeedBinding,
    LoadConfig,
    failing_clearly,
    failure,
)
from .metadata import (
    PartitionMetadata,
    add_unknown_partitions,
    maintenance_observation,
    materialization,
    materializations,
    materialized_reports,
    mirror_repairs,
    payload_warnings,
    sync_observation,
)
from .run_storage import (
    active_partitions,
    latest_metadata_by_partition,
    listed_partitions,
    oldest_running_load,
    recorded_user_deletes,
)
from .stalled_loads import signs_of_life
from .streams import StreamConfig, stream_run
from .warm_up import log_warm_up

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SparkResource(dg.ConfigurableResource):
    """A Spark session made on first use and shared by every partition the run loads (as dagster-pyspark's
    `LazyPySparkResource`), where `settings` (a `SparkSettings`) say:

    `embedded` (default): a Spark Connect client of the project's local Spark Connect server (started
    on first use and left running, so later runs only pay for a ~1 s client); `remote`: a cluster's
    Spark Connect URL (`sc://host:15002`); `local`: Spark inside the run process (tests).

        SparkResource(settings=SparkSettings(mode="remote", remote="sc://spark-connect.internal:15002"))
    """

    # A Dagster resource's configuration holds values of JSON (no pydantic models): the settings are
    # held as `SparkSettings` dumped to JSON, validated by it (`SparkSettings` is the one model).
    settings: dict[str, Any] = Field(
        default={},
        description="SparkSettings: mode (embedded | remote | local), remote, port, conf, work_dir, "
        "ship_package and the lakehouse's s3 storage (credentials by the names of "
        "their variables)",
    )
    _session: Any = PrivateAttr(default=None)

    @field_validator("settings", mode="before")
    @classmethod
    def _as_json(cls, value: Any) -> dict[str, Any]:
        settings = value if isinstance(value, SparkSettings) else SparkSettings.model_validate(value)
        return settings.model_dump(mode="json", exclude_defaults=True)

    @property
    def spark_settings(self) -> SparkSettings:
        return SparkSettings.model_validate(self.settings)

    @property
    def ships_package(self) -> bool:
        """Whether the loads send this package to the cluster as a Spark Connect artifact."""
        settings = self.spark_settings
        return settings.mode == "remote" and settings.ship_package

    @property
    def spark_session(self) -> "SparkSession":
        return self.session()

    def session(self, unresponsive_seconds: float = DEFAULT_UNRESPONSIVE_SECONDS) -> "SparkSession":
        """The run's session, made on first use; a Spark Connect server that does not answer its set-up
        within `unresponsive_seconds` ends the run with `SparkUnresponsive`."""
        if self._session is None:
            # the run's log says which Spark it is, where its UI is, and when the embedded server starts
            # (~40 s); a run is a short-lived process: the embedded server it starts stays for the next runs.
            # At exit the interpreter's last garbage collection walks every object the imports made
            # (Dagster's, pyspark's, pydantic's): 0.5 s of the run process's 0.7 s teardown
            # (benchmarks/README.md, "The process around the load"). `gc.freeze` in an exit hook leaves
            # them to the process's end; the hooks registered after it (the Spark client's close) run
            # before it, and nothing of a run is left to a finalizer at exit.
            settings = self.spark_settings.model_copy(update={"detach_server": True})
            logger = dg.get_dagster_logger()
            self._session = spark_session(settings, logger=logger, unresponsive_seconds=unresponsive_seconds)
            if settings.mode == "embedded":
                log_warm_up(settings.port, logger)
            atexit.register(gc.freeze)
        return self._session


class FeedApiResource(dg.ConfigurableResource):
    """The loads of feeds into their Delta tables, and the tables' maintenance, by the session of a
    Spark resource. A feed's asset yields what `load(context, binding)` yields; its maintenance job
    runs `maintain(context, binding)`."""

    # a nested Dagster resource, set up by Dagster with this one (any resource type: Dagster's resource
    # fields take no union of resource types)
    spark: dg.ConfigurableResource = Field(
        description="The Spark resource: a SparkResource, or a dagster-pyspark PySparkResource / "
        "LazyPySparkResource (its cluster's Python then needs feedapi-dagster installed, unless "
        "its session is a Spark Connect session, which gets this package as an artifact)"
    )

    @field_validator("spark")
    @classmethod
    def _has_session(cls, value: dg.ConfigurableResource) -> dg.ConfigurableResource:
        if not hasattr(type(value), "spark_session"):
            raise ValueError(
                f"the Spark resource must give a `spark_session` (a SparkResource, or dagster-pyspark's "
                f"PySparkResource or LazyPySparkResource), got {type(value).__name__}"
            )
        return value

    @property
    def spark_session(self) -> "SparkSession":
        return self.spark.spark_session  # type: ignore[attr-defined]  # checked by `_has_session`

    def table(self, binding: FeedBinding) -> FeedTable:
        return binding.table_for(self._session_for(binding))

    def _session_for(self, binding: FeedBinding) -> "SparkSession":
        """The run's session, its set-up bounded by the feed's `load.spark_unresponsive_seconds` (a session
        of the user's own resource is the resource's business)."""
        if isinstance(self.spark, SparkResource):
            return self.spark.session(binding.feed.load.spark_unresponsive_seconds)
        return self.spark_session

    def _answering(self, binding: FeedBinding, table: FeedTable) -> AbstractContextManager[None]:
        """The block's calls to Spark (a new table created by it) bounded by the feed's
        `load.spark_unresponsive_seconds` (`answering`)."""
        return answering(
            table.spark,
            f"the table of feed {binding.name}",
            unresponsive_seconds=binding.feed.load.spark_unresponsive_seconds,
        )

    def load(
        self, context: dg.AssetExecutionContext, binding: FeedBinding, config: LoadConfig | None = None
    ) -> Iterator[dg.AssetMaterialization | dg.AssetObservation | dg.AssetCheckResult]:
        """Load the run's partitions of the feed (those its tags list, or its partition keys) that no
        other run is loading, in one Spark job per wave: the materializations of the partitions it
        committed (and of those it was asked for and found up to date, except in the schedule's syncs),
        one observation of the sync, the checks of what it committed, the maintenance its commits made
        due; then a `dg.Failure` naming the partitions it could not load. Its log is never silent for
        long while it runs (`stalled_loads.signs_of_life`)."""
        config = config or LoadConfig()
        with signs_of_life(context, binding):
            self.clear_dead_streams(context.instance, binding, context.log, own_run_id=context.run.run_id)
            wanted = self._partitions_to_load(context, binding, config)
            outcome = self._load_partitions(context, binding, config, wanted)
            mirrored = yield from self._materialize(context, binding, outcome, wanted)
            yield sync_observation(binding, outcome, context.log)
            yield from self._check(context, binding, outcome, mirrored)
            yield from self._maintain_due(context, binding, outcome)
            if problem := failure(binding, outcome.reports.values()):
                raise problem

    def _partitions_to_load(
        self, context: dg.AssetExecutionContext, binding: FeedBinding, config: LoadConfig
    ) -> list[int]:
        """The run's partitions that no other run is loading; a `dg.Failure` where another run loads
        the run's only partition, or one it is to rebuild or drop."""
        keys = [int(key) for key in context.partition_keys]
        if (listed := listed_partitions(context.run.tags)) is not None:  # the sensor's and schedule's runs say which
            keys = [key for key in keys if key in listed]
        busy = active_partitions(context.instance, binding, exclude_run_id=context.run.run_id)
        if len(keys) == 1 and keys[0] in busy:
            raise dg.Failure(
                f"feed {binding.name} partition {keys[0]}: another run is loading it; not starting a "
                "second load (see the runs tagged feedapi/feed)",
                allow_retries=False,
            )
        if clash := busy & {*config.rebuild, *config.drop}:
            raise dg.Failure(f"feed {binding.name}: partitions {sorted(clash)} are being loaded by another run")
        wanted = [key for key in keys if key not in busy]
        if len(wanted) < len(keys):
            context.log.info("skipping partitions %s: other runs are loading them", sorted(set(keys) - set(wanted)))
        return wanted

    def _load_partitions(
        self,
        context: dg.AssetExecutionContext | dg.OpExecutionContext,
        binding: FeedBinding,
        config: LoadConfig,
        wanted: list[int] | None,
        what: str = "the load",
    ) -> LoadOutcome:
        """The load of `wanted` (None: every partition of the feed) into the feed's table, by the feed's
        loader; each partition it could not load in the run's log. `what`: how its failure names it."""
        rebuild = set(config.rebuild) | (set(wanted or ()) if context.run.tags.get(REBUILD_TAG) == "true" else set())
        table = self.table(binding)
        with failing_clearly(binding.name, what):  # its token, its discovery
            loader = FeedLoader.into(
                table,
                binding.feed.settings,
                binding.feed.load,
                run_id=context.run.run_id,
                logger=context.log,
                ship_package=self._ships_package(),
            )
            # a backfill of a closed partition rebuilds it from `_first`
            outcome = loader.load(
                wanted, rebuild=rebuild, drop=config.drop, rebuild_closed=BACKFILL_TAG in context.run.tags
            )
        for report in outcome.reports.values():
            if report.error:  # a failed or invalid partition (a waiting one's reason is `waiting_for`)
                context.log.error("partition %s: %s", report.partition_id, report.error)
            for line in payload_warnings(binding.name, report):  # never silent: a producer whose payloads drift
                context.log.warning(line)
        return outcome

    def _materialize(
        self, context: dg.AssetExecutionContext, binding: FeedBinding, outcome: LoadOutcome, wanted: list[int]
    ) -> Generator[dg.AssetMaterialization, None, dict[str, PartitionMetadata]]:
        """The materializations of the run's partitions (`materialized_reports`), then of those whose
        latest one disagrees with Delta's cursor of record; returns what each partition's latest
        materialization now says, by partition key."""
        # Dagster's view of every partition, read once (10,000 partitions: seconds)
        mirrored = latest_metadata_by_partition(
            context.instance, binding, [str(p) for p in outcome.committed.state.partitions]
        )
        reports = materialized_reports(context.run, outcome, wanted)
        logged = {str(report.partition_id): PartitionMetadata.of_report(report, outcome) for report in reports}
        repairs = mirror_repairs(outcome, mirrored, skip=[report.partition_id for report in reports])
        for key in repairs:
            context.log.info(
                "partition %s: materialization metadata was behind Delta; recorded the cursor of record", key
            )
        for key, metadata in (logged | repairs).items():
            yield materialization(binding, key, metadata)
        return mirrored | logged | repairs

    def _check(
        self,
        context: dg.AssetExecutionContext,
        binding: FeedBinding,
        outcome: LoadOutcome,
        mirrored: dict[str, PartitionMetadata],
    ) -> Iterator[dg.AssetCheckResult]:
        """The step's checks (`checks.py`) of the partitions the load committed something for; their calls
        to Spark bounded as the load's are (a frozen server would hold the run for ever: its signs of
        life keep the stalled-loads sensor away)."""
        loaded = [
            r.partition_id
            for r in outcome.reports.values()
            if r.status is LoadStatus.LOADED and r.delta_version is not None
        ]
        load = CheckedLoad(outcome, loaded, mirrored, recorded_user_deletes(context.instance, binding.key))
        selected = {key.name for key in context.selected_asset_check_keys if key.asset_key == binding.key}
        with self._answering(binding, outcome.table):
            yield from feed_check_results(load, selected)

    def _maintain_due(
        self, context: dg.AssetExecutionContext, binding: FeedBinding, outcome: LoadOutcome
    ) -> Iterator[dg.AssetObservation]:
        """The maintenance the load's commits made due: OPTIMIZE every `optimize_every_commits` commits,
        VACUUM every `vacuum_every_commits`."""
        operations = due(
            outcome.table, binding.feed.maintenance, unresponsive_seconds=binding.feed.load.spark_unresponsive_seconds
        )
        if operations:
            yield self._maintain(context, binding, outcome.table, operations)

    def stream(
        self, context: dg.OpExecutionContext, binding: FeedBinding, config: StreamConfig | None = None
    ) -> Iterator[dg.AssetMaterialization | dg.AssetObservation]:
        """Run the feed as a Structured Streaming query for the run (`streams.py`), after its backlog's
        batch load (`catch_up`): the materializations of the partitions each commit moved, as they land."""
        config = config or StreamConfig()
        with signs_of_life(context, binding):
            self.clear_dead_streams(context.instance, binding, context.log, own_run_id=context.run.run_id)
            if config.catch_up:
                yield from self._catch_up(context, binding)
                if config.trigger == "available_now":  # what the feed held is in the table: nothing is left
                    return
            # the stream's sink ensures the table, under the stream's watchdog (`stream_run`)
            yield from stream_run(context, self.table(binding), binding, config, self._ships_package())

    def _catch_up(
        self, context: dg.OpExecutionContext, binding: FeedBinding
    ) -> Iterator[dg.AssetMaterialization | dg.AssetObservation]:
        """The stream's backlog (every partition of the feed, from its cursor of record to where the feed is
        now) read and committed by a batch load: one Spark job and one commit, where micro-batches pay a
        query's start, a `foreachBatch` per micro-batch and its end (benchmarks/README.md, issue #38). The
        query then starts from the cursor of record this commit left; both keep the same one. The
        materializations of the partitions it moved, its observation; a `dg.Failure` naming the partitions
        it could not load (the query does not start)."""
        outcome = self._load_partitions(context, binding, LoadConfig(), None, "the stream's catch-up")
        loaded = [r for r in outcome.reports.values() if r.status is LoadStatus.LOADED and r.delta_version is not None]
        context.log.info(
            "feed %s: caught up by a batch load: %d events of partitions %s (Delta version %s)",
            binding.name,
            sum(r.events for r in loaded),
            [r.partition_id for r in loaded],
            outcome.committed.delta_version,
        )
        add_unknown_partitions(context.instance, binding, [r.partition_id for r in loaded])
        yield from materializations(binding, loaded, outcome)
        yield sync_observation(binding, outcome, context.log)
        if problem := failure(binding, outcome.reports.values()):
            raise problem

    def maintain(self, context: dg.OpExecutionContext, binding: FeedBinding) -> dg.AssetObservation:
        """OPTIMIZE and VACUUM of the feed's table; the observation of what they did, for the asset's page."""
        with signs_of_life(context, binding):
            self.clear_dead_streams(context.instance, binding, context.log, own_run_id=context.run.run_id)
            table = self.table(binding)
            with self._answering(binding, table):
                table.ensure_table()
            return self._maintain(context, binding, table, operations=None)

    def clear_dead_streams(
        self,
        instance: dg.DagsterInstance,
        binding: FeedBinding,
        log: Logger,
        own_run_id: str | None = None,
    ) -> list[str]:
        """Stop the queries that stream runs of the feed no longer alive left running (`dead_streams.py`),
        each with a line in `log`; the lines. No Spark session is made when no stream run may have left one."""
        wanted = dg.RunsFilter(tags={FEED_TAG: binding.name, STREAM_QUERY_TAG: RUNNING})
        if not (left := [run for run in instance.get_runs(wanted) if run.run_id != own_run_id]):
            return []
        settings = self.spark.spark_settings if isinstance(self.spark, SparkResource) else None
        if settings is not None and settings.mode == "embedded" and not port_open(settings.port):
            # no embedded server runs: the queries ended with the one that ran them (none is started here)
            for run in left:
                mark_query_stopped(instance, run.run_id)
            return []
        return clear_dead_streams(
            instance,
            binding,
            self.table(binding),
            log,
            own_run_id=own_run_id,
            remote_url=settings.remote if settings is not None and settings.mode == "remote" else None,
            unresponsive_seconds=binding.feed.load.spark_unresponsive_seconds,
        )

    def _maintain(
        self,
        context: dg.AssetExecutionContext | dg.OpExecutionContext,
        binding: FeedBinding,
        table: FeedTable,
        operations: tuple[str, ...] | None,
    ) -> dg.AssetObservation:
        # VACUUM keeps what the feed's loads that may still write need
        running = oldest_running_load(context.instance, binding, exclude_run_id=context.run.run_id)
        settings = binding.feed.maintenance
        bound = binding.feed.load.spark_unresponsive_seconds
        report = (
            maintain(table, settings, running, unresponsive_seconds=bound)
            if operations is None
            else maintain(table, settings, running, operations, unresponsive_seconds=bound)
        )
        context.log.info("feed %s: %s", binding.name, report)
        return maintenance_observation(binding, report)

    def _ships_package(self) -> bool:
        if isinstance(self.spark, SparkResource):
            return self.spark.ships_package
        # a session of the user's own resource: a Spark Connect session's cluster may lack the package
        return is_connect(self.spark_session)


_SHARED: dict[str, FeedApiResource] = {}


def shared_resource(settings: SparkSettings) -> FeedApiResource:
    """One resource per distinct Spark settings in a process: Dagster merges two Definitions binding
    one key only to the same object, so that the Definitions of two components (two defs.yaml) with
    the same Spark merge into one code location."""
    key = settings.model_dump_json()
    if key not in _SHARED:
        # `settings`' before-validator takes a SparkSettings; pydantic's typed __init__ knows only the stored dict
        _SHARED[key] = FeedApiResource(spark=SparkResource(settings=settings))  # type: ignore[arg-type]
    return _SHARED[key]
