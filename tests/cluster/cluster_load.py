"""Loads of every partition of a feed into a Delta table, through the standalone cluster's Spark
Connect server, one per line read from stdin. Runs in its own process (a Connect client cannot share
a process with the tests' classic Spark session), which starts its session once for all the loads.

    python cluster_load.py FEED_URL TABLE_PATH SPARK_CONNECT_URL PAUSE_DIR

Each stdin line `load` runs a load; `load-pausing` runs one that stops once its rows are committed
(its Spark job done, before its state commit): it creates PAUSE_DIR/rows_committed and waits for
PAUSE_DIR/go, so that the test can kill the executors right there. After each load, one JSON line on
stdout: whether it committed, and its error.
"""

import json
import sys
import time
from pathlib import Path

from feedapi_dagster.lakehouse.commit import ROWS_COMMITTED
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.lakehouse.load_settings import LoadSettings
from feedapi_dagster.lakehouse.loader import FeedLoader
from feedapi_dagster.lakehouse.sink import DeltaSink
from feedapi_dagster.protocol import RetryPolicy, feed_settings
from feedapi_dagster.spark.sessions import spark_session
from feedapi_dagster.spark.settings import SparkSettings


def main() -> None:
    url, table, remote, pause = sys.argv[1:5]
    pause_dir = Path(pause)
    pausing = False

    def at(moment: str, updates: dict) -> None:
        if pausing and moment == ROWS_COMMITTED:
            (pause_dir / "rows_committed").touch()
            while not (pause_dir / "go").exists():
                time.sleep(0.05)

    session = spark_session(SparkSettings(mode="remote", remote=remote))
    feed = feed_settings(url=url, page_size_hint=40, retry=RetryPolicy(base_delay=0.01, max_delay=0.1))
    for command in sys.stdin:
        pausing = command.strip() == "load-pausing"
        loader = FeedLoader(
            feed, DeltaSink(FeedTable(session, table)), LoadSettings(read_tasks=2), on_moment=at, ship_package=True
        )  # the cluster has no feedapi-dagster installed
        try:
            outcome = loader.load(p.id for p in loader.client.discover().partitions)
            print(json.dumps({"ok": True, "version": outcome.committed.delta_version}), flush=True)
        except Exception as error:  # noqa: BLE001 - reported to the test, which decides
            print(json.dumps({"ok": False, "error": f"{type(error).__name__}: {error}"[:3000]}), flush=True)


if __name__ == "__main__":
    main()
