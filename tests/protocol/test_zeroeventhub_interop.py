"""The v1 dialect reads a feed served by the reference `zeroeventhub` server helper.

zeroeventhub pins old fastapi/starlette, so it lives in its own virtualenv under .cache, created with
uv on first use (seconds once uv's cache is warm).
"""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from feedapi_dagster.protocol import FeedClient, feed_settings

from .conftest import pages_of, payloads, texts

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".cache" / "zeroeventhub-venv"
SERVER = Path(__file__).with_name("zeroeventhub_server.py")
PARTITIONS, EVENTS = 3, 250


def _uv() -> str:
    candidate = Path(sys.executable).with_name("uv")
    return str(candidate) if candidate.exists() else "uv"


@pytest.fixture(scope="module")
def zeroeventhub_feed(tmp_path_factory):
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([_uv(), "venv", "--quiet", "--python", sys.executable, str(VENV)], check=True)
        subprocess.run(
            [_uv(), "pip", "install", "--quiet", "--python", str(python), "zeroeventhub==0.2.3", "uvicorn>=0.29,<0.31"],
            check=True,
        )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path_factory.mktemp("zeh") / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(python), str(SERVER), str(port), str(PARTITIONS), str(EVENTS)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"zeroeventhub server did not start:\n{log.read_text()}")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/feed"
    finally:
        process.terminate()
        process.wait(10)


def test_v1_reads_every_partition_of_a_zeroeventhub_server(zeroeventhub_feed):
    client = FeedClient(feed_settings(url=zeroeventhub_feed, partition_count=PARTITIONS, page_size_hint=40))
    assert client.discover().dialect == "v1"  # negotiated: the handler answers 400 to a bare GET
    text = 'Grüße "zeh" \\ 日本'
    for partition in range(PARTITIONS):
        pages = pages_of(client, partition)
        events = [event for page in pages for event in payloads(page)]
        assert events == [{"id": f"{partition}-{i}", "n": i, "text": text} for i in range(EVENTS)]
        assert pages[-1].cursor == str(EVENTS)
        # zeroeventhub writes json.dumps output; the raw text is kept as sent, escapes and all
        assert texts(pages[0])[0] == json.dumps({"id": f"{partition}-0", "n": 0, "text": text})
    resumed = pages_of(client, 1, cursor="200")
    assert [e["n"] for page in resumed for e in payloads(page)] == list(range(200, EVENTS))
