"""What a Spark failure is, in one place: by its error condition where Spark gives one, by its text only
where the JVM's error has none.

A Spark Connect session raises a `PySparkException` whose `getCondition()` is the condition the server
sent (``DELTA_CONCURRENT_APPEND.WITHOUT_HINT``). A classic session raises pyspark's converted
exceptions (`PySparkException` too) for the JVM errors pyspark knows, and py4j's `Py4JJavaError` for
the others (a failed job, Delta's conflicts): the Java exception it holds is a `SparkThrowable`,
whose public `getCondition()` gives the same condition. Both were checked against Spark 4.2 and
Delta 4.4 (a kept read's blocks removed, two writers of one partition).

Hadoop's and the AWS SDK's exceptions (`s3a`) are no `SparkThrowable`: they reach Python with no
condition, as their class names and messages only, so `storage_failure` reads the text.
"""

from __future__ import annotations

import enum
import re

# Delta's conflicts between concurrent commits (its `DeltaConcurrentModificationException`s, SQLSTATE
# 2D521) that a commit resolves by reading the table again and retrying. Delta adds a subclass to
# some (``.WITHOUT_HINT``, ``.WITH_PARTITION_HINT``): `condition` keeps the class only.
COMMIT_CONFLICTS = frozenset(
    {
        "DELTA_CONCURRENT_APPEND",
        "DELTA_CONCURRENT_DELETE_DELETE",
        "DELTA_CONCURRENT_DELETE_READ",
        "DELTA_CONCURRENT_TRANSACTION",
        "DELTA_CONCURRENT_WRITE",
    }
)
# a block of a `localCheckpoint` is gone (with the executor that held it); Spark's own advice in the
# message (use `rdd.checkpoint()`) does not apply to a load
KEPT_BLOCK_LOST = "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND"

# a data source's name is taken: by a JVM data source, or (Spark's check of the name races with other
# clients of the session registering it) by the Python data source another client just registered
SOURCE_NAME_TAKEN = "DATA_SOURCE_ALREADY_EXISTS"

# classic pyspark's first line of a `Py4JJavaError`, before the Java exception's own
_PY4J_PREAMBLE = "An error occurred while calling"


def condition(error: BaseException) -> str | None:
    """The error condition Spark gave the failure, without its subclass (``DELTA_CONCURRENT_APPEND``);
    None when it has none."""
    full = _full_condition(error)
    return full.split(".", 1)[0] if full else None


def _full_condition(error: BaseException) -> str | None:
    from pyspark.errors import PySparkException

    if isinstance(error, PySparkException):
        return error.getCondition()
    java = getattr(error, "java_exception", None)  # a classic session's `Py4JJavaError`
    if java is None:
        return None
    from py4j.protocol import Py4JError

    try:
        return java.getCondition()
    except Py4JError:  # not a SparkThrowable (a Hadoop or JDK exception)
        return None


def is_commit_conflict(error: BaseException) -> bool:
    """A Delta commit that lost to another writer's and may be retried on the table as it is now."""
    return condition(error) in COMMIT_CONFLICTS


def is_kept_read_lost(error: BaseException) -> bool:
    """A job that needed blocks of a `localCheckpoint` that are gone."""
    return condition(error) == KEPT_BLOCK_LOST


def is_source_name_taken(error: BaseException) -> bool:
    """A data source's registration refused: its name is a data source's already (`SOURCE_NAME_TAKEN`)."""
    return condition(error) == SOURCE_NAME_TAKEN


class StorageFailure(enum.Enum):
    """Why the lakehouse's ``s3a`` storage failed, as Hadoop and the AWS SDK say it."""

    NO_S3A_FILE_SYSTEM = "no s3a file system"
    NO_CREDENTIALS = "no credentials"
    ACCESS_DENIED = "access denied"
    NO_BUCKET = "no such bucket"
    UNREACHABLE = "endpoint unreachable"


# What Hadoop's and the AWS SDK's errors say, by failure (checked in order): their class names and
# messages, the only thing that tells them apart (no error condition: see the module docstring).
_STORAGE_TEXTS: tuple[tuple[StorageFailure, tuple[str, ...]], ...] = (
    (
        StorageFailure.NO_S3A_FILE_SYSTEM,
        ("Class org.apache.hadoop.fs.s3a.S3AFileSystem", 'No FileSystem for scheme "s3a"'),
    ),
    (StorageFailure.NO_CREDENTIALS, ("NoAuthWithAWSException", "No AWS Credentials", "Unable to load credentials")),
    (
        StorageFailure.ACCESS_DENIED,
        ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403 Forbidden", "Status Code: 403"),
    ),
    (StorageFailure.NO_BUCKET, ("NoSuchBucket", "The specified bucket does not exist", "UnknownStoreException")),
    (
        StorageFailure.UNREACHABLE,
        ("UnknownHostException", "Connection refused", "ConnectException", "Unable to execute HTTP request"),
    ),
)


def storage_failure(error: BaseException) -> StorageFailure | None:
    """Why the storage failed, when a Spark error is one of the `StorageFailure`s; else None."""
    text = f"{type(error).__name__}: {error}"
    return next((failure for failure, needles in _STORAGE_TEXTS if any(needle in text for needle in needles)), None)


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first line of an error's message that says something (not classic pyspark's py4j preamble),
    at most `limit` characters: for a person, without the JVM's stack trace."""
    return next(
        (
            line.strip().lstrip(": ")
            for line in str(error).splitlines()
            if line.strip() and not line.startswith(_PY4J_PREAMBLE)
        ),
        "",
    )[:limit]


# the last line of a Python traceback that Spark carries in its message: `module.Class: message`
_PYTHON_RAISED = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception|Exhausted|Conflict|Failed|Lost)\w*): (.+)$"
)


def python_cause(error: BaseException, limit: int = 300) -> str:
    """What Python code running inside Spark (a data source's reader, a `foreachBatch` function) raised,
    as `Class: message`, when the Spark error carries its traceback; else `first_line`. A streaming
    query's failure starts with the condition and "Traceback (most recent call last):", which tells a
    person nothing."""
    raised = [match for line in str(error).splitlines() if (match := _PYTHON_RAISED.match(line.strip()))]
    ours = [m for m in raised if "Py4J" not in m.group(1) and "StreamingQuery" not in m.group(1)]
    if not ours:
        return first_line(error, limit)
    return f"{ours[-1].group(1)}: {ours[-1].group(2)}"[:limit]
