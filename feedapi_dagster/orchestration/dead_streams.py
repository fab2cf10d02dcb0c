"""What a stream run killed with its process leaves behind: its Structured Streaming query, which goes
on in the Spark Connect server (a query is the server's, not the client's).

The query stops itself at its next micro-batch once the run's lease has expired (`stream_lease.py`):
it commits nothing after `LEASE_SECONDS` and one commit. A query with nothing to read checks no lease:
every run of the feed (a load, a rebuild, its maintenance, a stream run) and the feed's stalled-loads
sensor first look for stream runs of the feed whose query may still run (the run tag
`feedapi/stream_query: running`, which a stream run sets when its query starts and changes to
`stopped` when it stopped it), and, for each whose run is no longer alive (ended in Dagster, or its
lease expired), stop its query in the Spark session the run tagged (`feedapi/spark_session`), with
one line in the log (and in the dead run's own): which run, and how many micro-batches it committed
after its run ended.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import dagster as dg

from feedapi_dagster.lakehouse.cursor_record import commits_of_run_after
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.lakehouse.stream_lease import LEASE_SECONDS, lease_renewed_at, stop_query
from feedapi_dagster.spark.sessions import connect_session_id, joined_session
from feedapi_dagster.spark.watchdog import answering

from .loads import FEED_TAG, FeedBinding
from .run_storage import ACTIVE_STATUSES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

STREAM_QUERY_TAG = "feedapi/stream_query"
STREAM_SESSION_TAG = "feedapi/spark_session"
RUNNING, STOPPED = "running", "stopped"

Logger = logging.Logger | logging.LoggerAdapter | dg.DagsterLogManager


def mark_query_started(instance: dg.DagsterInstance, binding: FeedBinding, run_id: str, spark: SparkSession) -> None:
    """Say on the run that its query may run, and in which Spark Connect session (none for a classic
    session: its query ends with the run's process)."""
    if (session_id := connect_session_id(spark)) is not None:
        instance.add_run_tags(
            run_id, {FEED_TAG: binding.name, STREAM_QUERY_TAG: RUNNING, STREAM_SESSION_TAG: session_id}
        )


def mark_query_stopped(instance: dg.DagsterInstance, run_id: str) -> None:
    instance.add_run_tags(run_id, {STREAM_QUERY_TAG: STOPPED})


def clear_dead_streams(
    instance: dg.DagsterInstance,
    binding: FeedBinding,
    table: FeedTable,
    log: Logger,
    *,
    own_run_id: str | None = None,
    remote_url: str | None = None,
    unresponsive_seconds: float,
) -> list[str]:
    """Stop the queries of the feed's stream runs that are no longer alive (see the module docstring),
    each with a warning in `log`; the lines logged. `remote_url`: the Spark Connect server's URL, to
    reach a session other than `table.spark`'s (a remote server gives each client one of its own)."""
    said = []
    wanted = dg.RunsFilter(tags={FEED_TAG: binding.name, STREAM_QUERY_TAG: RUNNING})
    for run in instance.get_runs(wanted):
        if run.run_id == own_run_id:
            continue
        with _session_of(run, table.spark, remote_url, unresponsive_seconds) as session:
            if session is None:  # its session is gone, and its query with it
                renewed, stopped = None, False
            else:
                with answering(session, f"the stream of run {run.run_id}", unresponsive_seconds=unresponsive_seconds):
                    renewed = lease_renewed_at(session, run.run_id)
                    if run.status in ACTIVE_STATUSES and renewed is not None and time.time() - renewed <= LEASE_SECONDS:
                        continue  # alive
                    stopped = stop_query(session, table.path, run.run_id)
        line = _what_was_done(instance, binding, table, run, renewed, stopped)
        log.warning(line)
        # and on the dead run's own page, where its operator looks
        instance.report_engine_event(line, run)
        said.append(line)
        mark_query_stopped(instance, run.run_id)
    return said


@contextlib.contextmanager
def _session_of(
    run: dg.DagsterRun, spark: SparkSession, remote_url: str | None, unresponsive_seconds: float
) -> Iterator[SparkSession | None]:
    """The Spark session the run's query runs in: `spark`'s own (every client of the embedded server
    joins one session), or the remote server's session the run tagged; None where it is gone."""
    session_id = run.tags.get(STREAM_SESSION_TAG)
    if session_id is None or session_id == connect_session_id(spark):
        yield spark
        return
    if remote_url is None:
        yield None
        return
    with joined_session(remote_url, session_id, unresponsive_seconds) as joined:
        try:
            with answering(joined, "a dead run's Spark session", unresponsive_seconds=unresponsive_seconds):
                joined.conf.get("spark.sql.session.timeZone")
        except Exception:  # noqa: BLE001 - the server ended that session (its idle timeout): nothing runs in it
            yield None
            return
        yield joined


def _what_was_done(
    instance: dg.DagsterInstance,
    binding: FeedBinding,
    table: FeedTable,
    run: dg.DagsterRun,
    renewed: float | None,
    stopped: bool,
) -> str:
    record = instance.get_run_record_by_id(run.run_id)
    # when the run ended: its lease's last renewal, else what Dagster says
    ended = renewed if renewed is not None else (record.end_time or record.start_time if record else None)
    after = commits_of_run_after(table, run.run_id, ended) if ended is not None else 0
    lease = (
        f"its lease last renewed at {datetime.fromtimestamp(renewed, UTC):%H:%M:%S} UTC"
        if renewed is not None
        else "its Spark session gone"
    )
    done = (
        f"stopped the stream query that run {run.run_id} left running"
        if stopped
        else f"the stream query of run {run.run_id} had stopped"
    )
    batches = "micro-batch" if after == 1 else "micro-batches"
    return (
        f"feed {binding.name}: {done} ({run.status.value} in Dagster, {lease}): it committed {after} {batches} "
        "after its run ended"
    )
