"""Run one sync of a feed into a Delta table and SIGKILL this process at a given moment.

    python load_and_die.py FEED_URL TABLE_PATH MOMENT WRITER BATCH_EVENTS READ_PROCESSES

WRITER is `deltalake` or the Spark Connect URL of the `spark` writer. MOMENT is `before_commit` or `after_commit`; the process dies the second time it gets there, so that
one batch is committed and the next is not (before) or is (after).
"""
import os
import signal
import sys

from feedapi_dagster.lakehouse.engines import DeltaRsEngine, SparkEngine
from feedapi_dagster.lakehouse.loader import FeedLoader, LoadSettings
from feedapi_dagster.lakehouse.sink import DeltaSink
from feedapi_dagster.lakehouse.spark import connect_session
from feedapi_dagster.protocol import FeedClient



def main() -> None:
    url, path, moment, writer, batch_events, read_processes = sys.argv[1:7]
    seen = []

    def die_at(name, updates):
        if name == moment:
            seen.append(name)
            if len(seen) == 2:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    engine = DeltaRsEngine(path) if writer == "deltalake" else SparkEngine(connect_session(writer), path)
    # reader processes, if any, must stop on their own when this process is killed
    settings = LoadSettings(batch_events=int(batch_events), fetch_workers=2, read_processes=int(read_processes))
    loader = FeedLoader(FeedClient(url, page_size_hint=50), DeltaSink(path, engine=engine), settings, on_moment=die_at)
    loader.sync()
    print("survived", flush=True)


if __name__ == "__main__":  # reader processes are spawned: they import this module
    main()
