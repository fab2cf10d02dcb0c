"""Run a `FeedStream` through a Spark Connect server in a process of its own (a test kills it), as a
Dagster stream run does.

    python -m tests.lakehouse.feed_stream_run FEED_URL TABLE_PATH CHECKPOINT CONNECT_URL TRIGGER

TRIGGER: `availableNow` (prints `done` when the query ends) or `processingTime` (a micro-batch every
0.5 s, until killed). Prints `started` once the query runs.
"""

import sys

from feedapi_dagster.lakehouse.feed_stream import FeedStream
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.protocol import RetryPolicy, feed_settings
from feedapi_dagster.spark.sessions import connect_session


def main() -> None:
    url, path, checkpoint, connect_url, trigger = sys.argv[1:6]
    spark = connect_session(connect_url)
    feed = feed_settings(url=url, page_size_hint=20, retry=RetryPolicy(base_delay=0.001, max_delay=0.01))
    stream = FeedStream(feed, FeedTable(spark, path), run_id=f"stream-{trigger}", checkpoint=checkpoint)
    query = stream.start({"availableNow": True} if trigger == "availableNow" else {"processingTime": "0.5 seconds"})
    print("started", flush=True)
    query.awaitTermination()
    if query.exception() is not None:
        print("failed", query.exception(), flush=True)
        sys.exit(1)
    print("done", flush=True)


if __name__ == "__main__":
    main()
