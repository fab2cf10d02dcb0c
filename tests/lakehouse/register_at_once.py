"""A run's first read through the `feedapi` data source on a Spark Connect server's session, made at the
same moment as other processes' (`test_concurrent_register.py`), for a few rounds.

    python register_at_once.py FOLDER NAME FEED_URL SPARK_CONNECT_URL SESSION_ID...

For each session id (a round: a server-side session of its own), it connects, says so (the file
FOLDER/ready-ROUND-NAME), waits until FOLDER/go-ROUND exists (the barrier: every client is connected
before any registers) and registers the source (`register_feed_source`); in the last round it also
reads the feed through it. Prints a JSON line per round: ``rows`` (the events read, last round), or
``error`` (a failure's type and text) and ``condition`` (its Spark error condition). Its clients are
closed without releasing their sessions (another client may still be using them), their calls bounded
as a run's are; a client that hangs all the same prints every thread's stack and exits.
"""

import faulthandler
import json
import sys
import time
from pathlib import Path

from feedapi_dagster.read.registration import register_feed_source
from feedapi_dagster.spark.failures import condition
from feedapi_dagster.spark.sessions import joined_session

HANG_SECONDS = 100  # the test waits 120 s


def main() -> None:
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
    folder, name, feed_url, url, *session_ids = sys.argv[1:]
    for round_, session_id in enumerate(session_ids):
        with joined_session(url, session_id, unresponsive_seconds=30) as spark:
            _round(spark, folder, name, feed_url, round_, last=round_ == len(session_ids) - 1)


def _round(spark, folder: str, name: str, feed_url: str, round_: int, last: bool) -> None:
    spark.range(1).collect()  # the server-side session exists: the race is the registration's only
    Path(folder, f"ready-{round_}-{name}").touch()
    go = Path(folder, f"go-{round_}")
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    out: dict = {"round": round_}
    try:
        register_feed_source(spark)
        if last:  # a read costs seconds (the session's Python workers): once
            out["rows"] = spark.read.format("feedapi").option("url", feed_url).load().count()
    except Exception as error:  # noqa: BLE001 - reported to the test
        out["error"] = f"{type(error).__name__}: {str(error)[:500]}"
        out["condition"] = condition(error)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
