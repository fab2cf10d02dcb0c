"""A Spark standalone cluster on 127.0.0.1, from pyspark's own classes: a master, two 1-core workers
and a Spark Connect server in front of them with the cached Delta jars. The project runs against it
with `spark.mode: remote`: discovery, a sync, a method-2 split and a backfill through Dagster. Tasks
run on both workers, every event lands once, and the feed's bearer token is in no file the cluster,
Spark's event log or Dagster wrote."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.lakehouse.jars import pyspark_home
from feedapi_dagster.lakehouse.spark import LOOPBACK, SparkConnectServer, find_free_port, port_open, read_token
from feedapi_dagster.lakehouse.state import read_committed_state

from ..lakehouse.conftest import payloads
from ..orchestration.test_secrets import files_containing

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-cluster-5e4d-secret"


class StandaloneCluster:
    def __init__(self, work: Path):
        self.work = work
        self.port = find_free_port()
        self.master = f"spark://{LOOPBACK}:{self.port}"
        self.processes: list[subprocess.Popen] = []

    def _start(self, name: str, *args: str) -> None:
        env = {**os.environ, "SPARK_HOME": str(pyspark_home()), "SPARK_LOCAL_IP": LOOPBACK,
               "SPARK_LOG_DIR": str(self.work / "logs")}
        log = open(self.work / f"{name}.log", "wb")
        self.processes.append(subprocess.Popen(
            [str(pyspark_home() / "bin" / "spark-class"), *args], env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True))

    def start(self) -> "StandaloneCluster":
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", LOOPBACK, "--port", str(self.port),
                    "--webui-port", str(find_free_port()))
        deadline = time.monotonic() + 120
        while not port_open(self.port):
            assert time.monotonic() < deadline, (self.work / "master.log").read_text()[-3000:]
            time.sleep(0.2)
        for n in (1, 2):
            (self.work / f"worker-{n}").mkdir()
            self._start(f"worker-{n}", "org.apache.spark.deploy.worker.Worker", "--host", LOOPBACK, "--cores", "1",
                        "--memory", "1g", "--work-dir", str(self.work / f"worker-{n}"),
                        "--webui-port", str(find_free_port()), self.master)
        deadline = time.monotonic() + 120
        while sum("Successfully registered with master" in (self.work / f"worker-{n}.log").read_text(errors="replace")
                  for n in (1, 2)) < 2:
            assert time.monotonic() < deadline, "the workers did not register"
            time.sleep(0.2)
        return self

    def executor_logs(self, n: int) -> str:
        return "".join(p.read_text(errors="replace") for p in (self.work / f"worker-{n}").rglob("stderr"))

    def stop(self) -> None:
        import signal

        for process in reversed(self.processes):
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    work = tmp_path_factory.mktemp("standalone")
    cluster = StandaloneCluster(work).start()
    events = work / "event-log"
    events.mkdir()
    server = SparkConnectServer(find_free_port(), work_dir=work / "connect", conf={
        "spark.master": cluster.master, "spark.executor.cores": "1", "spark.cores.max": "2",
        "spark.executor.memory": "1g", "spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(),
    })
    server.start()
    yield cluster, server
    server.stop()
    cluster.stop()


def test_the_project_on_a_standalone_cluster(spark, cluster, tmp_path):
    cluster, server = cluster
    feed = DemoFeed(partitions=3, events=900, seed=61)
    lakehouse, home = tmp_path / "lakehouse", tmp_path / "dagster_home"
    home.mkdir()
    env = {**os.environ, "CLUSTER_FEED_TOKEN": TOKEN, "SPARK_CONNECT_AUTHENTICATE_TOKEN": read_token(server.port),
           "PYTHONPATH": str(ROOT)}
    with DemoFeedServer(feed, dialect="published", token=TOKEN) as feed_server:
        flow = subprocess.run([sys.executable, str(Path(__file__).with_name("cluster_flow.py")), feed_server.url,
                               str(lakehouse), f"sc://localhost:{server.port}", str(home)],
                              capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
        assert flow.returncode == 0, flow.stdout[-2000:] + flow.stderr[-5000:]
        outcome = json.loads(flow.stdout.strip().splitlines()[-1])
    assert [step for step, ok in outcome["runs"] if not ok] == [], outcome
    assert {step for step, _ in outcome["runs"]} == {"discovery", "split", "schedule", "backfill"}
    assert outcome["backfill"]["rebuilt"] is True and outcome["backfill"]["drained"] is True

    table = str(lakehouse / "orders")
    state = read_committed_state(table).state
    assert sorted(state.partitions) == sorted([0, 1, 2, *outcome["children"]])
    parent_rows = set(payloads(spark, table, 0))
    every = []
    for partition in state.partitions:
        rows = payloads(spark, table, partition)
        published = feed.published(partition)
        if partition in outcome["children"]:  # continued from the parent's cursor: the rest of its history
            published = [e for e in published if e not in parent_rows]
        assert rows == published, f"partition {partition}"
        assert state.get(partition).position == len(rows)
        every += rows
    assert len(every) == len(set(every)) == len({e for p in state.partitions for e in feed.published(p)})
    for n in (1, 2):  # both workers ran read tasks
        assert "Running task" in cluster.executor_logs(n), f"no task ran on worker {n}"
    for root in (cluster.work, home, lakehouse):
        assert files_containing(root, TOKEN.encode()) == [], f"the token is in a file under {root}"
    assert any((cluster.work / "event-log").iterdir()), "Spark wrote no event log: the search proves nothing"
