"""A batch load SIGKILLed mid-read on a Spark Connect server: its Spark job (and the read tasks' Python
workers fetching pages) does not go on for ever. The server interrupts the work of a client whose RPC
is gone (`connect_server.DEAD_CLIENT_CONF`: at most 70 s); the pages stop coming within that, and
nothing of the dead load is committed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from feedapi_dagster.demo import DemoFeed
from feedapi_dagster.lakehouse.cursor_record import read_committed_state
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.spark.connect_server import DEAD_CLIENT_CONF
from tests.orchestration.test_stalled_loads import ThrottledServer

LOAD = textwrap.dedent("""\
    import sys
    from feedapi_dagster.lakehouse.feed_table import FeedTable
    from feedapi_dagster.lakehouse.load_settings import LoadSettings
    from feedapi_dagster.lakehouse.loader import FeedLoader
    from feedapi_dagster.lakehouse.sink import DeltaSink
    from feedapi_dagster.protocol import feed_settings
    from feedapi_dagster.spark.sessions import connect_session

    url, path, connect_url = sys.argv[1:4]
    spark = connect_session(connect_url)
    FeedLoader(feed_settings(url=url, page_size_hint=10), DeltaSink(FeedTable(spark, path)), LoadSettings()).sync()
""")


def _seconds(value: str) -> float:
    return float(value.removesuffix("s"))


@pytest.mark.spark
def test_a_killed_loads_spark_job_stops_fetching_pages_within_the_servers_detached_timeout(
    spark, connect_server, tmp_path
):
    bound = sum(_seconds(v) for v in DEAD_CLIENT_CONF.values()) + 15  # and a page or two in flight
    path = str(tmp_path / "feed")
    # 2 x 2,000 events in pages of 10 at a page a second: minutes of reading, far past the bound
    with ThrottledServer(DemoFeed(partitions=2, events=4000, seed=5)) as server:
        process = subprocess.Popen(
            [sys.executable, "-c", LOAD, server.url, path, connect_server.client_url()],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 180
            while server.pages < 6:
                assert process.poll() is None and time.monotonic() < deadline, "the load did not read"
                time.sleep(0.2)
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        killed = time.monotonic()
        last_page = (server.pages, killed)
        while time.monotonic() - last_page[1] < 20:  # 20 s without a page: its work is over
            assert time.monotonic() - killed < bound + 20, f"pages still fetched {time.monotonic() - killed:.0f} s on"
            if server.pages != last_page[0]:
                last_page = (server.pages, time.monotonic())
            time.sleep(0.5)
        stopped_after = last_page[1] - killed
        print(f"\nthe killed load's last page was fetched {stopped_after:.0f} s after the kill ({server.pages} pages)")
        assert stopped_after < bound
        assert server.pages < 2 * 200  # it did not read to the end
        if (tmp_path / "feed" / "_delta_log").exists():  # the load creates its table before it reads
            assert read_committed_state(FeedTable(spark, path)).state.partitions == {}  # nothing committed
