"""One load of every partition of a feed into a Delta table, through the standalone cluster's Spark
Connect server. Runs in its own process (a Connect client cannot share a process with the tests'
classic Spark session).

    python cluster_load.py FEED_URL TABLE_PATH SPARK_CONNECT_URL [PAUSE_DIR]

With PAUSE_DIR the load stops once its read is kept (Spark job 1 done, before the Delta write):
it creates PAUSE_DIR/read and waits for PAUSE_DIR/go, so that the test can kill the executors
holding the kept read right there. Prints one JSON line: whether the load committed, and its error.
"""
import json
import sys
import time
from pathlib import Path

from feedapi_dagster.lakehouse.delta import FeedTable
from feedapi_dagster.lakehouse.loader import READ, FeedLoader, LoadSettings
from feedapi_dagster.lakehouse.sink import DeltaSink
from feedapi_dagster.lakehouse.spark import SparkSettings, spark_session
from feedapi_dagster.protocol import Feed, RetryPolicy


def main() -> None:
    url, table, remote = sys.argv[1:4]
    pause = Path(sys.argv[4]) if len(sys.argv) > 4 else None

    def at(moment: str, updates: dict) -> None:
        if pause is not None and moment == READ:
            (pause / "read").touch()
            while not (pause / "go").exists():
                time.sleep(0.05)

    session = spark_session(SparkSettings(mode="remote", remote=remote))
    loader = FeedLoader(Feed(url=url, page_size_hint=40, retry=RetryPolicy(base_delay=0.01, max_delay=0.1)),
                        DeltaSink(FeedTable(session, table)), LoadSettings(read_tasks=2), on_moment=at)
    try:
        outcome = loader.load(p.id for p in loader.client.discover().partitions)
        print(json.dumps({"ok": True, "version": outcome.committed.delta_version}))
    except Exception as error:  # noqa: BLE001 - reported to the test, which decides
        print(json.dumps({"ok": False, "error": f"{type(error).__name__}: {error}"[:3000]}))


if __name__ == "__main__":
    main()
