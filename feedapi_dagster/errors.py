"""The one family of errors this package raises: catch `FeedApiDagsterError` for all of them, or a
subclass for one kind of failure.

    FeedApiDagsterError
    ├── ProtocolError            a feed's server refused, or retries ran out (`status`, `partition`)
    │   ├── RediscoveryNeeded    409: the discovery token changed
    │   └── MalformedResponse    a body that is not the protocol's (retried from the last good cursor)
    ├── StorageError             the lakehouse's storage refused or cannot be reached
    ├── StateError               the cursor of record cannot be read or recovered
    ├── LoadError                a load could not finish (what was committed before is kept)
    │   ├── CommitExhausted      Delta's optimistic commit lost every retry to other writers
    │   └── RebuildAbandoned     a rebuild stopped before its atomic replace: nothing was replaced
    └── SparkError               Spark could not be started, reached or set up

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


class LoadError(FeedApiDagsterError):
    """A load could not finish; what it committed before the failure is kept."""


class CommitExhausted(LoadError):
    """Delta's optimistic commit kept losing to other writers of the table until its retries ran out."""


class RebuildAbandoned(LoadError):
    """A rebuild stopped before its atomic replace of the partitions' rows: nothing was replaced."""


class SparkError(FeedApiDagsterError):
    """Spark could not be started, reached or set up (its server, its session, its jars)."""
