"""`LoadSettings`: how a feed's batch loads read it (the `load:` section of a feed's configuration)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from feedapi_dagster.spark.watchdog import DEFAULT_UNRESPONSIVE_SECONDS


class LoadSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # A bound per partition and Spark job (its task stops at the first checkpoint past it): a sync
    # goes on with another job, and another commit, until the partition is caught up. None: one
    # job reads each partition to its current end. Rebuilds read whole partitions regardless.
    max_events_per_partition: int | None = Field(default=None, ge=1)
    # Spark tasks a load's read is spread over (partitions grouped by expected size); None: up to 16.
    read_tasks: int | None = Field(default=None, ge=1)
    # When the server's retention dropped events after a partition's cursor before they were read
    # (Nakadi): `stop` leaves the partition where it is, fails the load and its retention check, until
    # someone decides; `skip` accepts the loss and reads on from the oldest event still there (the
    # check fails for that load and names what was lost).
    retention_gap: Literal["stop", "skip"] = "stop"
    # A Spark Connect server that answers nothing for this long ends the load (`watchdog.py`): its
    # Dagster run fails and frees its slot instead of waiting for ever.
    spark_unresponsive_seconds: float = Field(default=DEFAULT_UNRESPONSIVE_SECONDS, ge=1)
