"""The one family of errors this package raises: catch `FeedApiDagsterError` for all of them, or a
subclass for one kind of failure.

    FeedApiDagsterError
    ├── ProtocolError            a feed's server refused, or retries ran out (`status`, `partition`)
    │   ├── RediscoveryNeeded    409: the discovery token changed
    │   └── MalformedResponse    a body that is not the protocol's (retried from the last good cursor)
    ├── StorageError             the lakehouse's storage refused or cannot be reached
    ├── StateError               the cursor of record cannot be read or recovered
    ├── LayoutMismatch           a feed's table exists with another layout than the feed's `layout`
    ├── PayloadFormMismatch      a feed's table has another payload form than its `payload_form` can become
    ├── LoadError                a load could not finish (what was committed before is kept)
    │   ├── CommitExhausted      Delta's optimistic commit lost every retry to other writers
    │   ├── PartitionConflict    another load committed a partition first (`partition_id`)
    │   ├── KeptReadLost         the read Spark kept was lost before its write: nothing committed
    │   ├── RunGone              a stream's run stopped renewing its lease: its micro-batch committed nothing
    │   ├── PayloadSchemaFrozen  a key the frozen schema of a columns table has no column for: nothing committed
    │   └── RebuildAbandoned     a rebuild stopped before its atomic replace: nothing was replaced
    └── SparkError               Spark could not be started, reached or set up
        └── SparkUnresponsive    the Spark Connect server stopped answering: the load was abandoned

A few subclasses live beside the code that raises them, for the code that catches them there:
`DeltaJarsError` (`spark/jar_resolution.py`), `DeltaJarsNotSetUp` (`spark/jars.py`) and
`ServerNotStopped` (`spark/embedded.py`) are `SparkError`s, `RecoveryNeedsSpark`
(`lakehouse/cursor_record.py`) and `UnreadableMetadata` (`orchestration/metadata.py`) `StateError`s,
`ReadEndsMissing` (`lakehouse/feed_read.py`) and `UnparsedCountMissing` (`lakehouse/payload_form.py`; `load_execution.py`
catches it: the load goes on, a warning says the count is unknown) `LoadError`s, and `StreamReplayFailed`
(`read/stream_source.py`) a `FeedApiDagsterError` of its own.

Messages name the feed by its URL without credentials and never quote a token. This module is pure
Python: every layer imports it, it imports nothing of the package.
"""

from __future__ import annotations


class FeedApiDagsterError(Exception):
    """Anything feedapi-dagster reports as a failure of its own."""


class ProtocolError(FeedApiDagsterError):
    """A feed request failed in a way the caller must see (bad request, auth, retries exhausted)."""

    def __init__(self, message: str, *, status: int | None = None, partition: int | None = None):
        super().__init__(message)
        self.status = status
        self.partition = partition


class RediscoveryNeeded(ProtocolError):
    """The server answered 409: its discovery token changed, so partitions must be discovered again."""


class MalformedResponse(ProtocolError):
    """A body that cannot be read as the protocol's (cut short, junk, invalid UTF-8, non-object line).

    Raised mid-stream after every complete checkpoint before the damage has been yielded; the client
    retries from the last good cursor.
    """


class StorageError(FeedApiDagsterError):
    """The lakehouse's storage (a folder, an s3a:// bucket) refused or cannot be reached."""


class StateError(FeedApiDagsterError):
    """The cursor of record in a feed table's commits cannot be read or recovered."""


class LayoutMismatch(FeedApiDagsterError):
    """A feed's table exists with another layout (clustered, partitioned, none) than the feed's `layout`
    setting: a Delta table's layout cannot change in place, so nothing is loaded into it."""


class PayloadFormMismatch(FeedApiDagsterError):
    """A feed's table has the payload's variant column (`data`) or typed columns and the feed's
    `payload_form` is another: its loads would leave them NULL, so nothing is loaded into it."""


class LoadError(FeedApiDagsterError):
    """A load could not finish; what it committed before the failure is kept."""


class PayloadSchemaFrozen(LoadError):
    """A columns table's feed freezes its schema (`payload_columns.evolution: freeze`) and a write's
    payloads have a key (or nested field) it has no column for: the write commits nothing."""

    def __init__(self, message: str, key: str, partition: int):
        super().__init__(message)
        self.key = key
        self.partition = partition


class CommitExhausted(LoadError):
    """Delta's optimistic commit kept losing to other writers of the table until its retries ran out."""


class PartitionConflict(LoadError):
    """Another load committed progress for a partition this load was writing: this load's rows for it
    are discarded (they are the other load's too) and the load stops; the next load goes on."""

    def __init__(self, message: str, *, partition_id: int):
        super().__init__(message)
        self.partition_id = partition_id


class RunGone(LoadError):
    """A stream's micro-batch found that the run driving its query is gone (its lease expired,
    `lakehouse.stream_lease`): it committed nothing, and the query stops."""

    def __init__(self, message: str, *, run_id: str):
        super().__init__(message)
        self.run_id = run_id


class KeptReadLost(LoadError):
    """The read Spark kept (`localCheckpoint`) was lost before its Delta write (an executor holding it
    died): the load committed nothing, and the next load reads the partitions again."""


class RebuildAbandoned(LoadError):
    """A rebuild stopped before its atomic replace of the partitions' rows: nothing was replaced."""


class SparkError(FeedApiDagsterError):
    """Spark could not be started, reached or set up (its server, its session, its jars)."""


class SparkUnresponsive(SparkError):
    """The Spark Connect server did not answer within the bound (`load.spark_unresponsive_seconds`):
    the load was abandoned and its Spark client closed; what it committed stays."""


class ProjectDoesNotLoad(FeedApiDagsterError):
    """A dg project's definitions do not load (its code, its defs.yaml): what `dg check defs` reports."""
