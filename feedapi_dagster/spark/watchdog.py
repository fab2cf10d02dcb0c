"""No Spark Connect call of a load waits for ever.

pyspark's Connect client gives its calls no deadline (a job may rightly run for an hour), so a Spark
Connect server that stops answering (stopped, swapped out, wedged) would hold a load, its Dagster
run and its pool slot for good. `answering` watches the server while a load talks to it: every
`probe_seconds` it asks the server for a setting on the same connection (a `Config` call, which
Spark Connect answers from its own threads whatever its jobs do); when no answer comes within
`unresponsive_seconds`, it closes the session's client, which cancels every call in flight, and the
load fails with `SparkUnresponsive`. A classic in-process session has no server to lose. A session's
set-up is watched too, from its first call (`sessions.connect_session`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from feedapi_dagster.errors import SparkUnresponsive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_UNRESPONSIVE_SECONDS = 60.0
_PROBED_SETTING = "spark.sql.session.timeZone"


def is_connect(session: Any) -> bool:
    """Whether `session` is a Spark Connect client session (not a classic in-process one)."""
    return type(session).__module__.startswith("pyspark.sql.connect")


@contextlib.contextmanager
def answering(
    spark: SparkSession,
    what: str,
    *,
    unresponsive_seconds: float = DEFAULT_UNRESPONSIVE_SECONDS,
    probe_seconds: float | None = None,
) -> Iterator[None]:
    """Run the block with the Spark Connect server watched (see the module docstring); `what` names
    the work in the error."""
    if not is_connect(spark):
        yield
        return
    watch = _Watch(spark, unresponsive_seconds, probe_seconds or min(10.0, unresponsive_seconds / 3))
    watch.start()
    try:
        yield
    except Exception as error:
        if watch.gave_up is not None:
            raise watch.error(what) from error
        raise
    finally:
        watch.stop()
    if watch.gave_up is not None:  # the block swallowed the cancelled call's error
        raise watch.error(what)


class _Watch:
    def __init__(self, spark: SparkSession, unresponsive_seconds: float, probe_seconds: float):
        self.spark = spark
        self.unresponsive_seconds = unresponsive_seconds
        self.probe_seconds = probe_seconds
        self.gave_up: float | None = None  # seconds without an answer, once given up
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feedapi-spark-watchdog", daemon=True)
        self._url = _server_address(spark)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def error(self, what: str) -> SparkUnresponsive:
        return SparkUnresponsive(
            f"{what}: the Spark Connect server {self._url} did not answer for {self.gave_up:.0f} s "
            f"(bound: {self.unresponsive_seconds:g} s); the load was abandoned and its Spark client closed. "
            "What it had committed stays; the next load resumes from the cursors of record. Check the server "
            "(its process, memory, log) or raise `load.spark_unresponsive_seconds`"
        )

    def _run(self) -> None:
        # the first probe at once: a server frozen before the block started is given up on within the bound
        wait = 0.0
        while not self._stopped.wait(wait):
            wait = self.probe_seconds
            answered = threading.Event()
            asked = time.monotonic()
            # the probe runs in a thread of its own: a call to a server that does not answer never returns
            threading.Thread(target=self._probe, args=(answered,), name="feedapi-spark-probe", daemon=True).start()
            while not answered.wait(1.0):
                if self._stopped.is_set():
                    return
                if time.monotonic() - asked >= self.unresponsive_seconds:
                    self._give_up(time.monotonic() - asked)
                    return

    def _probe(self, answered: threading.Event) -> None:
        try:
            self.spark.conf.get(_PROBED_SETTING)
        except Exception:  # noqa: BLE001 - an error is an answer: the server (or the client's end) is there
            pass
        answered.set()

    def _give_up(self, waited: float) -> None:
        self.gave_up = waited
        log.error(
            "the Spark Connect server %s has not answered for %.0f s: closing the load's Spark client",
            self._url,
            waited,
        )
        # closing the channel cancels every call in flight on it (the load's, and the probe)
        with contextlib.suppress(Exception):
            self.spark.client.close()


def _server_address(spark: SparkSession) -> str:
    host = getattr(getattr(spark, "client", None), "host", None)
    return f"at {host}" if host else "(unknown)"
