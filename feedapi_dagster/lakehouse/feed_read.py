"""`FeedRead`: one read of the feed as the loader hands it to the commit: the rows to write and where
each partition's read stopped. The checkpoint rows of the `feedapi` source (`END_COLUMN`) end here.

Two kinds, by what the commit needs before it writes:

* **streamed** (`FeedRead.streamed`): the rows go from the source's tasks straight into the Delta
  write, one Spark job, nothing kept. The checkpoint rows are taken out of that job by Spark's
  `observe`: observed metrics are accumulators, and Spark merges a result task's accumulators only
  from the attempt whose output it keeps (a failed or speculative attempt's output and metrics are
  both dropped), so the ends it reports are those of exactly the rows Delta committed. They are known
  once the job is over: the commit of the rows cannot carry them (`cursor_record.py`: rows commit,
  then state commit). Each job (a retried commit reads the feed again) gets an observation of its own.
* **kept** (`FeedRead.kept`): Spark keeps what one attempt of each task read (`localCheckpoint`, on
  disk) before anything is written, and the ends are collected from it first. For what must be known
  before the write: a rebuild replaces rows only when every partition read whole, and an at-least-once
  feed's rows are deduplicated against the table by a shuffle, whose retried stages would read the feed
  again, differently, if the read were not kept. The kept blocks are released explicitly (`release`).
"""

from __future__ import annotations

import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from feedapi_dagster.errors import LoadError
from feedapi_dagster.read.read_tasks import END_COLUMN, ReadEnd
from feedapi_dagster.spark.failures import first_line

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

_ENDS = "ends"
# how long the read ends (and a job's other observed metrics) may take to arrive after the job that wrote
# the rows (they come with its result over Spark Connect; a classic session's listener hands them over
# shortly after the job)
ENDS_TIMEOUT_SECONDS = 60.0
# how long the release of a kept read may take (a Spark Connect call; pyspark's own, run when the
# DataFrame is collected, has no deadline: SPARK-58846)
RELEASE_TIMEOUT_SECONDS = 30.0


class ReadEndsMissing(LoadError):
    """Spark committed a streamed read's rows but did not report where its partitions stopped."""


@dataclass(frozen=True)
class PartitionEnd:
    """Where the read of one partition stopped: the cursor to resume from, the position its next event
    gets (before any deduplication against the table), and the read's figures."""

    cursor: str
    position: int
    read: ReadEnd


class FeedRead:
    """See the module docstring. `frame()` gives the rows to write (a new observed query for each
    Spark job of a streamed read); `ends()` where each partition stopped, once known."""

    def __init__(self, source: DataFrame, *, kept: bool):
        self.kept = kept
        self._source = source
        self._observation: Any = None
        self._ends: dict[int, PartitionEnd] | None = _collect_ends(source) if kept else None

    @classmethod
    def streamed(cls, source: DataFrame) -> FeedRead:
        """`source`: the `feedapi` source with its checkpoint rows."""
        return cls(source, kept=False)

    @classmethod
    def kept_from(cls, kept_source: DataFrame) -> FeedRead:
        """`kept_source`: the source with its checkpoint rows, kept by Spark (`localCheckpoint`)."""
        return cls(kept_source, kept=True)

    def frame(self) -> DataFrame:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        source = self._source
        if not self.kept:
            # a name of its own: a classic session matches observations to queries by name, and two
            # loads of one session (threads) may run at once
            self._observation = Observation(f"feedapi_read_ends_{uuid.uuid4().hex}")
            source = source.observe(
                self._observation,
                F.collect_list(
                    F.when(F.col(END_COLUMN).isNotNull(), F.struct("partition_id", "cursor", "position", END_COLUMN))
                ).alias(_ENDS),
            )
        return source.where(F.col(END_COLUMN).isNull()).drop(END_COLUMN)

    def ends(self) -> dict[int, PartitionEnd]:
        """Where each partition stopped: for a streamed read, as the last job that wrote `frame()`
        read it (call it only once that job's commit landed)."""
        if self._ends is None:
            if self._observation is None:
                raise ReadEndsMissing("no Spark job has written this read yet")
            self._ends = _ends(observed(self._observation, "read ends", ReadEndsMissing)[_ENDS])
        return self._ends

    def release(self) -> None:
        """Free what Spark keeps of a kept read, now and within a bound (nothing for a streamed one)."""
        if self.kept:
            release_kept(self._source)


def observed(observation: Any, what: str, missing: type[LoadError]) -> dict[str, Any]:
    """The metrics of `observation` (Spark's `Observation`, of a job that has run), within
    `ENDS_TIMEOUT_SECONDS`; `missing` (saying `what` they are) where Spark did not report them."""
    # A classic session's `get` waits for the metrics without a bound (they come by a listener)
    with ThreadPoolExecutor(1, thread_name_prefix="feedapi-observed") as pool:
        future = pool.submit(lambda: observation.get)
        try:
            return dict(future.result(timeout=ENDS_TIMEOUT_SECONDS))
        except FutureTimeout:
            raise missing(f"Spark reported no {what} within {ENDS_TIMEOUT_SECONDS:g} s") from None
        except Exception as error:  # noqa: BLE001 - pyspark raises its assertion error, or the job's
            raise missing(f"Spark reported no {what} ({type(error).__name__}: {error})") from error


def _collect_ends(kept: DataFrame) -> dict[int, PartitionEnd]:
    return _ends(
        kept.where(f"{END_COLUMN} IS NOT NULL").select("partition_id", "cursor", "position", END_COLUMN).collect()
    )


def _ends(rows: list) -> dict[int, PartitionEnd]:
    return {row[0]: PartitionEnd(row[1], row[2], ReadEnd.from_json(row[3])) for row in rows}


def release_kept(frame: DataFrame) -> None:
    """Release a `localCheckpoint` of a Spark Connect session within `RELEASE_TIMEOUT_SECONDS`.

    pyspark (4.2) releases it only in `CachedRemoteRelation.__del__`, when the DataFrame is collected,
    with a Connect call that has no deadline: a load once hung there for good. There is no public API
    to release it: this sends the same command (`RemoveRemoteCachedRelation`) through the session's
    client with a deadline, then clears the relation's id so that `__del__` sends nothing. A classic
    session's kept blocks go with the DataFrame (its context cleaner, no remote call).
    """
    plan = getattr(frame, "_plan", None)
    relation_id = getattr(plan, "_relation_id", None)
    session = getattr(plan, "_spark_session", None)
    if plan is None or relation_id is None or session is None:
        return
    plan._relation_id = None  # __del__ now sends nothing
    client = session.client
    if client.is_closed:
        return
    from pyspark.sql.connect.plan import RemoveRemoteCachedRelation

    try:
        request = client._execute_plan_request_with_metadata()
        if client._user_id:
            request.user_context.user_id = client._user_id
        plan._relation_id = relation_id  # for the command's text only
        request.plan.command.CopyFrom(RemoveRemoteCachedRelation(plan).command(session=client))
        plan._relation_id = None
        # the same call as pyspark's release: each response of the stream read, under one deadline
        for _ in client._stub.ExecutePlan(
            request, metadata=client._builder.metadata(), timeout=RELEASE_TIMEOUT_SECONDS
        ):
            pass
    except Exception as error:  # noqa: BLE001 - a release that fails is logged; the session's end frees it
        plan._relation_id = None
        log.warning(
            "the read Spark kept was not released (%s); it is freed when the session ends",
            first_line(error) or type(error).__name__,
        )
