"""A stream run's lease: how a feed's Structured Streaming query knows that the run driving it is alive.

On a Spark Connect server a query outlives the client that started it: a run whose process is killed
(an OOM kill, a container restart) leaves its query running in the server, committing micro-batches
that nobody sees in Dagster. So the run holds a lease, and the query's commits check it:

* the run renews it (`LeaseRenewal`, a thread of the run's process) every `RENEW_SECONDS`: a runtime
  setting of the query's Spark session (`lease_key(run_id)`), whose value is the time of the renewal;
* each micro-batch (`LeaseCheck`, in `foreachBatch`, which a Connect server runs in a Python process
  joined to the same session) looks at it before it reads the feed and again just before its Delta
  commit: a lease older than `LEASE_SECONDS` fails the micro-batch with `RunGone`, which stops the
  query. Nothing of that micro-batch is committed.

An orphan's last commit is therefore at most `LEASE_SECONDS` plus one commit's duration after its run's
last renewal (benchmarks/README.md has the measured figure). The lease's times are the run's clock read
against the Spark driver's: a lease that looks old (clocks apart by more than `LEASE_SECONDS`) is
believed once it is seen renewed.

A query that has no micro-batch to run (a feed with nothing new) checks nothing: the feed's next run,
or its stalled-loads sensor, stops it (`stop_query`). Queries are named after their table and run
(`query_name`), so that a run finds what a dead one left.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from feedapi_dagster.errors import LoadError, RunGone
from feedapi_dagster.spark.watchdog import is_connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

RENEW_SECONDS = 1.0
LEASE_SECONDS = 10.0
_LEASE_PREFIX = "feedapi.streamLease."


def lease_key(run_id: str) -> str:
    return f"{_LEASE_PREFIX}{run_id}"


def query_name(table_path: str, run_id: str) -> str:
    """The name of the query of `run_id` into the table at `table_path` (Spark's UI lists it)."""
    return f"feedapi {table_path} run {run_id}"


def lease_renewed_at(spark: SparkSession, run_id: str) -> float | None:
    """When the run's lease was last renewed (a Unix time, the run's clock); None: it holds none."""
    value = spark.conf.get(lease_key(run_id), None)
    return float(value) if value else None


class LeaseRenewal:
    """The run's side: renews the lease of `run_id` while its query is active (a daemon thread)."""

    def __init__(self, spark: SparkSession, run_id: str):
        self.spark = spark
        self.key = lease_key(run_id)
        self.query: StreamingQuery | None = None  # once set: renewed while it is active
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Renew now, then every `RENEW_SECONDS` until `end` (or until `query`, once set, is no longer
        active), before the query starts: its first micro-batch finds the lease. None in a classic
        session (`LeaseCheck` checks none there)."""
        if not is_connect(self.spark):
            return
        self._renew()
        self._thread = threading.Thread(target=self._run, name=f"feedapi-{self.key}", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        self.spark.conf.set(self.key, f"{time.time():.3f}")

    def _run(self) -> None:
        while not self._stopped.wait(RENEW_SECONDS):
            try:
                if self.query is not None and not self.query.isActive:
                    return
                self._renew()
            except Exception as error:  # noqa: BLE001 - the server's hiccup: the next renewal may pass
                log.warning("the stream's lease %s was not renewed now (%s)", self.key, error)

    def end(self) -> None:
        """Stop renewing and give the lease up (a query still running then fails its next commit)."""
        self._stopped.set()
        if self._thread is None:
            return
        self._thread.join(timeout=RENEW_SECONDS + 30)
        try:
            self.spark.conf.unset(self.key)
        except Exception as error:  # noqa: BLE001 - a server gone: the lease stays, expired
            log.warning("the stream's lease %s was not given up (%s)", self.key, error)


class LeaseCheck:
    """The query's side: whether the run of `run_id` still renews its lease (picklable: it travels with
    `foreachBatch`'s function)."""

    def __init__(self, run_id: str, lease_seconds: float = LEASE_SECONDS):
        self.run_id = run_id
        self.lease_seconds = lease_seconds

    def ensure_alive(self, spark: SparkSession) -> None:
        """Return when the run renewed its lease within `lease_seconds` (or renews it within two renewals,
        for a run whose clock is behind); `RunGone` otherwise. Nothing to check in a classic session: its
        query runs in the run's process and ends with it (and its micro-batches see a clone of the
        session's settings, made when the query started)."""
        if not is_connect(spark):
            return
        renewed = lease_renewed_at(spark, self.run_id)
        if renewed is not None and time.time() - renewed <= self.lease_seconds:
            return
        deadline = time.monotonic() + 2 * RENEW_SECONDS + 0.5
        while renewed is not None and time.monotonic() < deadline:
            time.sleep(RENEW_SECONDS / 4)
            if lease_renewed_at(spark, self.run_id) != renewed:
                return
        age = (
            "it holds no lease" if renewed is None else f"its lease was last renewed {time.time() - renewed:.0f} s ago"
        )
        raise RunGone(
            f"the run {self.run_id} that drives this stream is gone ({age}, longer than {self.lease_seconds:g} s): "
            "this micro-batch commits nothing and the query stops; the feed's next run continues from the "
            "table's cursor of record",
            run_id=self.run_id,
        )


def stop_query(spark: SparkSession, table_path: str, run_id: str) -> bool:
    """Stop the query of `run_id` into `table_path` where `spark`'s session runs it, and give its lease
    up; whether it was running."""
    name = query_name(table_path, run_id)
    running = [query for query in spark.streams.active if query.name == name]
    for query in running:
        query.stop()
    spark.conf.unset(lease_key(run_id))
    return bool(running)


def stop_queries_of_gone_runs(spark: SparkSession, table_path: str, run_id: str) -> list[str]:
    """Stop the queries into `table_path` in `spark`'s session that the stream of `run_id` must not run
    beside: one of its own run (an earlier process of it), and those of runs whose lease has expired,
    waiting up to `LEASE_SECONDS` for a lease just renewed (a run killed a moment ago); the run ids whose
    queries were stopped. `LoadError` when another run's lease is still renewed: it streams the table."""
    prefix = query_name(table_path, "")
    stopped = []
    for query in spark.streams.active:
        if not (query.name or "").startswith(prefix):
            continue
        other = query.name.removeprefix(prefix)
        if other != run_id and not _expires(spark, other):
            raise LoadError(
                f"run {other} streams into {table_path} and renews its lease: one stream of a table at a time"
            )
        log.warning("stopping the query of run %s into %s: its run is gone", other, table_path)
        query.stop()
        spark.conf.unset(lease_key(other))
        stopped.append(other)
    return stopped


def _expires(spark: SparkSession, run_id: str) -> bool:
    """Whether the lease of `run_id` is expired, or expires within `LEASE_SECONDS`."""
    deadline = time.monotonic() + LEASE_SECONDS + 2 * RENEW_SECONDS
    while True:
        renewed = lease_renewed_at(spark, run_id)
        if renewed is None or time.time() - renewed > LEASE_SECONDS:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(RENEW_SECONDS)
