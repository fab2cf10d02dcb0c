"""Runs of different feeds that start at the same moment on one Spark Connect server (issue 35): every
client of the embedded server joins one server-side session (`SparkConnectServer.client_url`), so their
first loads register the `feedapi` data source into that session at once. Spark checks a name before
it registers it (`DataSourceRegistration.checkDataSourceExists`: not registered yet, then looked up as
a JVM source) without a lock: a client whose check runs while another registers finds the other's
`feedapi` in the lookup and fails with DATA_SOURCE_ALREADY_EXISTS. Each round is a fresh server-side
session (a session_id of its own, as after a server restart), its clients released together by a file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

from feedapi_dagster.demo import DemoFeed, DemoFeedServer

CLIENT = Path(__file__).with_name("register_at_once.py")
CLIENTS = 3
ROUNDS = 3
EVENTS = 20


def test_clients_of_one_session_register_the_source_at_once(connect_server, tmp_path):
    base = connect_server.client_url().rsplit(";session_id=", 1)[0]
    sessions = [str(uuid.uuid4()) for _ in range(ROUNDS)]
    with DemoFeedServer(DemoFeed(partitions=1, events=EVENTS, seed=35)) as feed:
        clients = [
            subprocess.Popen(
                [sys.executable, str(CLIENT), str(tmp_path), str(n), feed.url, base, *sessions],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for n in range(CLIENTS)
        ]
        try:
            for round_ in range(ROUNDS):
                deadline = time.monotonic() + 60
                while len(list(tmp_path.glob(f"ready-{round_}-*"))) < CLIENTS:
                    assert time.monotonic() < deadline, "a client did not connect in 60 s"
                    assert all(c.poll() is None for c in clients), [c.communicate() for c in clients]
                    time.sleep(0.01)
                (tmp_path / f"go-{round_}").touch()
            outputs = [c.communicate(timeout=120) for c in clients]
        finally:
            for c in clients:
                c.kill()
    results = [json.loads(line) for out, _ in outputs for line in out.splitlines() if line.startswith("{")]
    assert len(results) == CLIENTS * ROUNDS, [err[-2000:] for _, err in outputs]
    failures = [r for r in results if "error" in r]
    assert not failures, failures
    assert [r["rows"] for r in results if r["round"] == ROUNDS - 1] == [EVENTS] * CLIENTS
