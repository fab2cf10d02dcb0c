"""A load Dagster leaves waiting for a free slot of its feed's pool is handed it by the feed's
stalled-loads sensor. The race, in Dagster 1.13's SQL storages (`claim_concurrency_slot`): run B looks
for a free slot (none: run A holds the pool's only one), A frees it and hands it to the steps queued
then (none), B queues its step. No later free comes to hand B the slot: without the sensor B waits
for ever, holding a run slot and its partition (seen in a chaos run: two runs of one feed at once)."""

from __future__ import annotations

import time
from pathlib import Path

import dagster as dg
from dagster._core.instance.ref import InstanceRef

import feedapi_dagster.demo
from feedapi_dagster.orchestration import FeedConfig, ProjectConfig, build_feedapi_definitions, feed_bindings
from feedapi_dagster.orchestration.stalled_loads import LOST_WAIT_SECONDS, hand_out_free_slots

STEP = "feedapi__orders"


def _instance(tmp_path: Path) -> dg.DagsterInstance:
    home = tmp_path / "home"
    home.mkdir()
    # the dagster.yaml the project ships (pools: default_limit 1)
    (home / "dagster.yaml").write_text(Path(feedapi_dagster.demo.__file__).with_name("dagster.yaml").read_text())
    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))


def _sensor_tick(instance: dg.DagsterInstance, defs: dg.Definitions) -> str:
    sensor = defs.get_sensor_def("feedapi_orders_stalled_loads")
    with dg.build_sensor_context(instance=instance, resources=dict(defs.resources)) as context:
        result = sensor.evaluate_tick(context)
    return result.skip_message or ""


def test_a_step_queued_just_after_the_last_slot_was_freed_is_handed_it_by_the_sensor(tmp_path):
    config = ProjectConfig(
        lakehouse=str(tmp_path / "lake"), feeds=[FeedConfig(name="orders", url="http://127.0.0.1:9/feed")]
    )
    defs = build_feedapi_definitions(config)
    binding, _ = next(feed_bindings(config))
    instance = _instance(tmp_path)
    storage = instance.event_log_storage
    storage.initialize_concurrency_limit_to_default(binding.pool)

    # the race, step by step, with the calls `claim_concurrency_slot` makes
    assert storage.claim_concurrency_slot(binding.pool, "run-a", STEP).is_claimed
    assert not storage.has_unassigned_slots(binding.pool)  # B looks: no free slot
    storage.free_concurrency_slot_for_step("run-a", STEP)  # A ends: nobody queued to hand it to
    storage.add_pending_step(binding.pool, "run-b", STEP, should_assign=False)  # B queues
    for _ in range(3):  # B's claims from now on: it waits, with the pool's slot free
        assert not storage.claim_concurrency_slot(binding.pool, "run-b", STEP).is_claimed
    info = storage.get_concurrency_info(binding.pool)
    assert (info.slot_count, info.active_slot_count, info.pending_step_count) == (1, 0, 1)

    # a step that has just queued is left to Dagster
    assert "no run of feed orders" in _sensor_tick(instance, defs)
    assert not storage.claim_concurrency_slot(binding.pool, "run-b", STEP).is_claimed

    # once it has waited LOST_WAIT_SECONDS, the sensor hands it the slot, and its next claim has it
    later = time.time() + LOST_WAIT_SECONDS + 1
    [line] = hand_out_free_slots(instance, binding, later)
    assert "run run-b" in line and f"pool {binding.pool}; handed it" in line
    assert storage.claim_concurrency_slot(binding.pool, "run-b", STEP).is_claimed

    # a step queued while the slot is held (Dagster's own path hands it over) is not touched
    storage.add_pending_step(binding.pool, "run-c", STEP, should_assign=False)
    assert hand_out_free_slots(instance, binding, later + LOST_WAIT_SECONDS) == []
    assert not storage.claim_concurrency_slot(binding.pool, "run-c", STEP).is_claimed
    storage.free_concurrency_slot_for_step("run-b", STEP)
    assert storage.claim_concurrency_slot(binding.pool, "run-c", STEP).is_claimed
    instance.dispose()
