"""Run syncs of a feed into a Delta table through a Spark Connect server, and SIGKILL this process at
a given moment.

    python load_and_die.py FEED TABLE_PATH MOMENT SPARK_CONNECT_URL [STORAGE_JSON]

FEED: a FeedAPI feed's URL, or a feed's settings as JSON (a Nakadi event type).

Each sync loads at most 100 events per partition. MOMENT is `read`, `before_commit` or
`after_commit`: the process dies the second time it gets there, so that one load is committed and the
next is not (read, before) or is (after). With MOMENT `none` it syncs once and exits. STORAGE_JSON:
the lakehouse's `S3Storage` (the table is on S3), whose settings and credentials the session brings to
the server (as a project's run does).
"""

import json
import os
import signal
import sys

from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.lakehouse.load_settings import LoadSettings
from feedapi_dagster.lakehouse.loader import FeedLoader
from feedapi_dagster.lakehouse.sink import DeltaSink
from feedapi_dagster.protocol import feed_settings
from feedapi_dagster.spark.sessions import connect_session
from feedapi_dagster.spark.storage import S3Storage


def main() -> None:
    feed, path, moment, connect_url = sys.argv[1:5]
    storage = S3Storage.model_validate_json(sys.argv[5]) if len(sys.argv) > 5 else None
    seen = []
    unresponsive = float(os.environ.get("UNRESPONSIVE_SECONDS", "60"))

    def die_at(name, updates):
        if name == moment:
            seen.append(name)
            if len(seen) == 2:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    options = storage.storage_options() if storage else None
    spark = connect_session(connect_url, storage=storage, unresponsive_seconds=unresponsive)
    sink = DeltaSink(FeedTable(spark, path, storage_options=options))
    settings = json.loads(feed) if feed.startswith("{") else {"url": feed}
    loader = FeedLoader(
        feed_settings(**{**settings, "page_size_hint": 50}),
        sink,
        LoadSettings(max_events_per_partition=100, spark_unresponsive_seconds=unresponsive),
        on_moment=die_at,
    )
    for _ in range(1 if moment == "none" else 3):
        loader.sync()
    print("survived", flush=True)


if __name__ == "__main__":
    main()
