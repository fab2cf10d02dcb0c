"""The stalled-load sensor of a feed, `feedapi_<feed>_stalled_loads`: a load whose process is gone is
marked failed, so that its pool slot is freed and the feed loads again.

Dagster's run monitoring checks a run worker's health only where the run launcher can (the Docker,
Kubernetes and ECS launchers); under the default run launcher it checks a STARTED run's age only
(`dagster/max_runtime`). When a load's worker dies with the code server that started it (a killed or
restarted container, a rebooted machine), nobody says so: the run stays STARTED for ever, keeps the
feed's pool slot (`feedapi_<feed>`, limit 1) and the schedule skips its partitions. (A worker that
dies alone is reported failed by its code server within seconds.)

Every run of the feed that holds its pool (a load, its maintenance, its stream) keeps its log from
falling silent: while its step runs, a thread of the run worker looks at the run's newest event every
sixth of `schedule.stalled_load_seconds` and, when the log has been quiet for a third of it (a long
Delta write, the checks' scans, OPTIMIZE; the read logs every 10 s on its own), says the run is still
at work (`signs_of_life`). So the sensor, evaluated by the daemon, takes a STARTED run of the feed
whose newest event is older than `schedule.stalled_load_seconds` for dead, whatever the run launcher:
it marks it failed with one line in the run's log saying why, and run monitoring
(`free_slots_after_run_end_seconds` in the shipped dagster.yaml) frees its slot. A run whose step
waits for the pool's slot logs only every 300 s (Dagster's "Step still blocked by limit for pool"):
it has those 300 s more. A worker that is alive but stuck keeps its signs of life: what bounds a stuck
load is the load's own bounds (every call to Spark, HTTP or S3 has one), not this sensor.

A load can also wait for ever for a slot that is free. Dagster hands a freed slot to a step already
queued for it; a step that looked for a free slot just before a run freed the pool's last one, and
queued itself just after, is never handed one (`claim_concurrency_slot` checks, then queues, without a
lock). The sensor hands such a step the free slot (`hand_out_free_slots`): what Dagster's own freeing
does, once the step has waited `LOST_WAIT_SECONDS`.

Not `dagster/max_runtime`: it cuts a run by its age, alive or not. A limit that lets a 30-minute load
of a large feed finish leaves a dead load holding the feed's slot for as long; one that frees the slot
within minutes cuts every long load.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from .loads import MAINTENANCE_TAG, FeedBinding
from .run_storage import runs_loading

log = logging.getLogger(__name__)

# Dagster's executor logs "Step still blocked by limit for pool" this often while a step waits for a
# slot (`CONCURRENCY_CLAIM_MESSAGE_INTERVAL` in dagster._core.execution.plan.active; not public)
POOL_WAIT_MESSAGE_SECONDS = 300
_STARTED = dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])
# a queued step that has waited this long while the pool has a free slot is taken for lost (Dagster's
# own path hands a slot out in the same call that frees it)
LOST_WAIT_SECONDS = 30.0


@dataclass(frozen=True)
class StalledLoad:
    run: dg.DagsterRun
    silent_seconds: float  # since the newest event in the run's log


def stalled_loads(instance: dg.DagsterInstance, binding: FeedBinding, now: float) -> list[StalledLoad]:
    """The feed's STARTED runs (loads, streams, maintenance: those in its pool) whose log has been silent longer than the feed allows (`now`: a Unix time)."""
    limit = binding.feed.schedule.stalled_load_seconds
    stalled = []
    maintenance = dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED], tags={MAINTENANCE_TAG: binding.name})
    for record in [*runs_loading(instance, binding, runs=_STARTED), *instance.get_run_records(maintenance)]:
        # DagsterInstance has no public read of a run's newest event; this is the call its run page makes
        newest = instance.get_records_for_run(record.dagster_run.run_id, limit=1, ascending=False).records
        since = newest[0].event_log_entry.timestamp if newest else (record.start_time or now)
        allowed = limit + (POOL_WAIT_MESSAGE_SECONDS if newest and _waits_for_pool(newest[0].event_log_entry) else 0)
        if now - since > allowed:
            stalled.append(StalledLoad(record.dagster_run, now - since))
    return stalled


def _waits_for_pool(entry: dg.EventLogEntry) -> bool:
    """Whether the entry is Dagster's note that the run's step waits for a pool slot (the only event
    with a `pool` in its metadata)."""
    event = entry.dagster_event
    return (
        event is not None
        and event.event_type == dg.DagsterEventType.ENGINE_EVENT
        and "pool" in event.engine_event_data.metadata
    )


def fail_stalled_loads(instance: dg.DagsterInstance, binding: FeedBinding, now: float) -> list[str]:
    """Mark the feed's stalled loads failed, each with one line in its log; what was done, a line a run."""
    done = []
    for stalled in stalled_loads(instance, binding, now):
        run = instance.get_run_by_id(stalled.run.run_id)
        if run is None or run.status != dg.DagsterRunStatus.STARTED:  # it ended meanwhile
            continue
        message = (
            f"feed {binding.name}: this run's process is taken for dead (a killed container or machine): "
            f"its log has been silent for {stalled.silent_seconds:.0f} s, longer than "
            f"schedule.stalled_load_seconds ({binding.feed.schedule.stalled_load_seconds} s); marked failed "
            f"by sensor feedapi_{binding.name}_stalled_loads so that its pool slot is freed. What it "
            "committed stays; the next load goes on from the cursor of record"
        )
        # not public on DagsterInstance: the call Dagster's own run monitoring makes to fail a run whose
        # worker is gone (there is no other way to end a run from outside it)
        instance.report_run_failed(run, message)
        done.append(f"run {run.run_id} marked failed: log silent for {stalled.silent_seconds:.0f} s")
    return done


def hand_out_free_slots(instance: dg.DagsterInstance, binding: FeedBinding, now: float) -> list[str]:
    """Hand the feed's pool's free slots to the steps queued for it that Dagster never handed one
    (the module docstring says how that happens); what was done, a line a step."""
    storage = instance.event_log_storage
    # not public: the call with which Dagster's storage hands freed slots to queued steps (its
    # `free_concurrency_slot_for_step` makes it); the SQL storages (SQLite, Postgres, MySQL) have it
    assign = getattr(storage, "assign_pending_steps", None)
    if assign is None or not storage.supports_global_concurrency_limits:
        return []
    done = []
    info = storage.get_concurrency_info(binding.pool)
    free = info.slot_count - max(info.assigned_step_count, info.active_slot_count)
    lost = sorted(
        (step for step in info.pending_steps if step.assigned_timestamp is None),
        key=lambda step: (-(step.priority or 0), step.enqueued_timestamp),
    )
    for step in lost[: max(free, 0)]:
        waited = now - _unix_time(step.enqueued_timestamp)
        if waited < LOST_WAIT_SECONDS:
            break
        assign([binding.pool])  # the first queued step, by priority then age: this one
        done.append(
            f"run {step.run_id}: its step {step.step_key} waited {waited:.0f} s for a free slot of pool {binding.pool}; handed it"
        )
    return done


def _unix_time(moment: datetime) -> float:
    # the SQL storages keep UTC; SQLite's without a zone
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


@contextlib.contextmanager
def signs_of_life(context: dg.AssetExecutionContext | dg.OpExecutionContext, binding: FeedBinding) -> Iterator[None]:
    """While the block runs, a line in the run's log whenever it has been quiet for a third of
    `schedule.stalled_load_seconds` (looked at every sixth of it): the run's sign that its process is
    alive, whatever its step is doing (Dagster's log manager takes lines from any thread)."""
    limit = binding.feed.schedule.stalled_load_seconds
    run_id = context.run.run_id
    stopped = threading.Event()

    def watch() -> None:
        started = time.monotonic()
        while not stopped.wait(limit / 6):
            # a storage hiccup (a dropped database connection) must not end the run's signs of life:
            # the sensor would take the live run for dead
            try:
                newest = context.instance.get_records_for_run(run_id, limit=1, ascending=False).records
                quiet = time.time() - newest[0].event_log_entry.timestamp if newest else limit
                if quiet >= limit / 3:
                    context.log.info(
                        "feed %s: still at work after %.0f s (nothing logged for %.0f s)",
                        binding.name,
                        time.monotonic() - started,
                        quiet,
                    )
            except Exception as error:  # noqa: BLE001 - any failure of the instance's storage
                log.warning("feed %s: the run's signs of life could not be written now (%s)", binding.name, error)

    watcher = threading.Thread(target=watch, name=f"feedapi-{binding.name}-signs-of-life", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stopped.set()
        watcher.join(timeout=limit / 6 + 30)  # its look at the run's log, if one is under way


def build_stalled_load_sensor(binding: FeedBinding) -> dg.SensorDefinition:
    limit = binding.feed.schedule.stalled_load_seconds

    @dg.sensor(
        name=f"feedapi_{binding.name}_stalled_loads",
        # a tenth of the limit: a dead load is seen at most 10% after its limit
        minimum_interval_seconds=max(5, limit // 10),
        # on whatever the schedule's and discovery's settings: a dead run blocks every load of the feed
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Marks failed the runs of feed `{binding.name}` whose log has been silent for "
        f"{limit} s (their process is gone), so that the feed's pool slot is freed; hands a free slot "
        "to a load Dagster left waiting for one; stops the streaming queries of stream runs that are gone.",
    )
    def stalled(context: dg.SensorEvaluationContext, feedapi: dg.ResourceParam[Any]) -> dg.SkipReason:
        now = time.time()
        done = fail_stalled_loads(context.instance, binding, now) + hand_out_free_slots(context.instance, binding, now)
        for line in done:
            context.log.warning("feed %s: %s", binding.name, line)
        # `feedapi` (RESOURCE_KEY) is the definitions' `FeedApiResource`, whose module imports this one
        done += feedapi.clear_dead_streams(context.instance, binding, context.log)
        return dg.SkipReason(
            "; ".join(done) if done else f"no run of feed {binding.name} has been silent for {limit} s"
        )

    return stalled
