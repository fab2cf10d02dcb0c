"""Run a `feedapi` streaming query into a Delta table in a process of its own (a test kills it).

    python stream_to_delta.py FEED_URL TABLE_PATH CHECKPOINT SESSION TRIGGER [MAX_EVENTS_PER_TRIGGER]

SESSION: `connect:<url>` (a Spark Connect client of that server) or `classic:<work dir>` (a local
Spark of this process: killing the process kills the query). TRIGGER: `availableNow` (prints
`done` when the query ends) or `processingTime` (runs until killed). Prints `batch <id>` as each
micro-batch ends.
"""

import sys
from pathlib import Path

from feedapi_dagster import FeedDataSource
from feedapi_dagster.lakehouse.feed_stream import stream_to_delta
from feedapi_dagster.spark.sessions import connect_session, local_spark_session


def main() -> None:
    url, path, checkpoint, session, trigger = sys.argv[1:6]
    limit = sys.argv[6] if len(sys.argv) > 6 else None
    kind, _, where = session.partition(":")
    spark = connect_session(where) if kind == "connect" else local_spark_session(work_dir=Path(where))
    spark.dataSource.register(FeedDataSource)
    reader = spark.readStream.format("feedapi").option("url", url).option("pageSizeHint", "10")
    if limit:
        reader = reader.option("maxEventsPerTrigger", limit)
    writer = stream_to_delta(reader.load(), path, checkpoint)
    if trigger == "availableNow":
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        print("done", query.lastProgress["batchId"] if query.lastProgress else None, flush=True)
    else:
        query = writer.trigger(processingTime="0 seconds").start()
        query.awaitTermination()


if __name__ == "__main__":
    main()
