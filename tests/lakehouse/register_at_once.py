"""A run's first read through the `feedapi` data source on a Spark Connect server's session, made at the
same moment as other processes' (`test_concurrent_register.py`), for a few rounds.

    python register_at_once.py FOLDER NAME FEED_URL SPARK_CONNECT_URL...

For each URL (a round: a server-side session of its own), it connects, says so (the file
FOLDER/ready-ROUND-NAME), waits until FOLDER/go-ROUND exists (the barrier: every client is connected
before any registers) and registers the source (`register_feed_source`); in the last round it also
reads the feed through it. Prints a JSON line per round: ``rows`` (the events read, last round), or
``error`` (a failure's type and text) and ``condition`` (its Spark error condition). Its sessions are
left to the server: another client may still be using them.
"""

import json
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession

from feedapi_dagster.lakehouse.sessions import register_feed_source
from feedapi_dagster.lakehouse.spark_errors import condition


def main() -> None:
    folder, name, feed_url, *urls = sys.argv[1:]
    for round_, url in enumerate(urls):
        spark = SparkSession.builder.remote(url).create()  # not the last round's (`getOrCreate`'s)
        spark.range(1).collect()  # the server-side session exists: the race is the registration's only
        Path(folder, f"ready-{round_}-{name}").touch()
        go = Path(folder, f"go-{round_}")
        deadline = time.monotonic() + 60
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.001)
        out: dict = {"round": round_}
        try:
            register_feed_source(spark)
            if round_ == len(urls) - 1:  # a read costs seconds (the session's Python workers): once
                out["rows"] = spark.read.format("feedapi").option("url", feed_url).load().count()
        except Exception as error:  # noqa: BLE001 - reported to the test
            out["error"] = f"{type(error).__name__}: {str(error)[:500]}"
            out["condition"] = condition(error)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
