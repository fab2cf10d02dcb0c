"""A Spark standalone cluster on 127.0.0.1, from pyspark's own classes: a master, two 1-core workers
and a Spark Connect server in front of them with the cached Delta and s3a jars, speculation on. The
project runs against it with `spark.mode: remote` and its lakehouse on the S3 server: discovery, a
sync, a method-2 split and a backfill through Dagster; the executors write the files. Tasks run on
both workers, every event lands once, and the feed's bearer token is in no file the cluster, Spark's
event log or Dagster wrote, nor in any object of the lakehouse. Then the executors die in the middle of a read and
between a load's rows commit and its state commit, and a slow read task gets a speculative copy: every
event still lands once, and the cursors committed are those of the attempt whose rows Delta kept."""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from feedapi_dagster.demo import DemoFeed, DemoFeedServer, Gate
from feedapi_dagster.lakehouse.cursor_record import read_committed_state
from feedapi_dagster.spark.connect_server import SparkConnectServer, port_open, read_token
from feedapi_dagster.spark.jars import pyspark_home
from feedapi_dagster.spark.settings import LOOPBACK
from tests.ports import find_free_port

from ..conftest import BUCKET, C1_ONLY, TEST_SERVER_CONF
from ..lakehouse.conftest import payloads
from ..orchestration.test_secrets import files_containing

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-cluster-5e4d-secret"


class StandaloneCluster:
    def __init__(self, work: Path, env: dict[str, str]):
        """`env`: what the cluster's machines have in their environment (its S3 credentials)."""
        self.work = work
        self.env = env
        self.port = find_free_port()
        self.master = f"spark://{LOOPBACK}:{self.port}"
        self.processes: list[subprocess.Popen] = []

    def _start(self, name: str, *args: str) -> None:
        env = {
            **os.environ,
            **self.env,
            "SPARK_HOME": str(pyspark_home()),
            "SPARK_LOCAL_IP": LOOPBACK,
            "SPARK_LOG_DIR": str(self.work / "logs"),
            "SPARK_DAEMON_JAVA_OPTS": C1_ONLY,  # the master and the workers, as the tests' servers (conftest)
        }
        log = open(self.work / f"{name}.log", "wb")
        self.processes.append(
            subprocess.Popen(
                [str(pyspark_home() / "bin" / "spark-class"), *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def start(self) -> "StandaloneCluster":
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            LOOPBACK,
            "--port",
            str(self.port),
            "--webui-port",
            str(find_free_port()),
        )
        deadline = time.monotonic() + 120
        while not port_open(self.port):
            assert time.monotonic() < deadline, (self.work / "master.log").read_text()[-3000:]
            time.sleep(0.2)
        # two host names for one machine: Spark never runs a speculative copy on the host of the original
        for n, host in ((1, LOOPBACK), (2, "localhost")):
            (self.work / f"worker-{n}").mkdir()
            self._start(
                f"worker-{n}",
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                host,
                "--cores",
                "1",
                "--memory",
                "1g",
                "--work-dir",
                str(self.work / f"worker-{n}"),
                "--webui-port",
                str(find_free_port()),
                self.master,
            )
        deadline = time.monotonic() + 120
        while (
            sum(
                "Successfully registered with master" in (self.work / f"worker-{n}.log").read_text(errors="replace")
                for n in (1, 2)
            )
            < 2
        ):
            assert time.monotonic() < deadline, "the workers did not register"
            time.sleep(0.2)
        return self

    def executor_logs(self, n: int) -> str:
        return "".join(p.read_text(errors="replace") for p in (self.work / f"worker-{n}").rglob("stderr"))

    def kill_executors(self) -> int:
        """SIGKILL every executor JVM of this cluster (the workers start new ones); how many there were."""
        killed = 0
        for proc in Path("/proc").iterdir():
            try:
                if b"CoarseGrainedExecutorBackend" in (proc / "cmdline").read_bytes() and os.readlink(
                    proc / "cwd"
                ).startswith(str(self.work)):
                    os.kill(int(proc.name), signal.SIGKILL)
                    killed += 1
            except (OSError, ValueError):
                continue
        return killed

    def stop(self) -> None:
        for process in reversed(self.processes):
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, s3_storage):
    work = tmp_path_factory.mktemp("standalone")
    # the cluster's own credentials for the S3 server (an instance role, on a real one); its s3a
    # settings come with each session (the project's storage setting)
    credentials = s3_storage.credentials()
    cluster = StandaloneCluster(work, credentials).start()
    events = work / "event-log"
    events.mkdir()
    server = SparkConnectServer(
        find_free_port(),
        work_dir=work / "connect",
        conf={
            **TEST_SERVER_CONF,
            "spark.executor.extraJavaOptions": C1_ONLY,
            "spark.master": cluster.master,
            "spark.executor.cores": "1",
            "spark.cores.max": "2",
            "spark.executor.memory": "1g",
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": events.as_uri(),
            # a task running 1.5x as long as the median of its finished peers gets a copy on another host
            "spark.speculation": "true",
            "spark.speculation.interval": "200ms",
            "spark.speculation.quantile": "0.5",
            "spark.speculation.multiplier": "1.5",
            "spark.speculation.minTaskRuntime": "1s",
        },
        env=credentials,
    )
    server.start()
    yield cluster, server
    server.stop()
    cluster.stop()


@pytest.mark.parametrize("lakehouse", ["s3"], indirect=True)
def test_the_project_on_a_standalone_cluster(spark, cluster, lakehouse, s3_server, tmp_path):
    cluster, server = cluster
    feed = DemoFeed(partitions=3, events=900, seed=61)
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {
        **os.environ,
        "CLUSTER_FEED_TOKEN": TOKEN,
        "SPARK_CONNECT_AUTHENTICATE_TOKEN": read_token(server.port),
        "PYTHONPATH": str(ROOT),
    }
    with DemoFeedServer(feed, dialect="published", token=TOKEN) as feed_server:
        flow = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).with_name("cluster_flow.py")),
                feed_server.url,
                lakehouse.root,
                f"sc://localhost:{server.port}",
                str(home),
                lakehouse.storage.model_dump_json(),
            ],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
            cwd=ROOT,
        )
        assert flow.returncode == 0, flow.stdout[-2000:] + flow.stderr[-5000:]
        outcome = json.loads(flow.stdout.strip().splitlines()[-1])
    assert [step for step, ok in outcome["runs"] if not ok] == [], outcome
    assert {step for step, _ in outcome["runs"]} == {"discovery", "split", "schedule", "backfill"}
    assert outcome["backfill"]["rebuilt"] is True and outcome["backfill"]["drained"] is True

    table = lakehouse.table("orders")
    state = read_committed_state(lakehouse.log(table)).state
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
    for root in (cluster.work, home):
        assert files_containing(root, TOKEN.encode()) == [], f"the token is in a file under {root}"
    objects = s3_server.keys(BUCKET, lakehouse.root.split(f"s3a://{BUCKET}/", 1)[1])
    assert any("/part-" in key for key in objects), "the executors wrote no data file to S3"
    assert [key for key in objects if TOKEN.encode() in s3_server.read(BUCKET, key)] == []
    assert any((cluster.work / "event-log").iterdir()), "Spark wrote no event log: the search proves nothing"


class CountingGate(Gate):
    """Holds the fetches of one partition, and sets `second` when two are held at once: a second
    attempt of the task reading it (a speculative copy) is reading it too."""

    def __init__(self, partition: int):
        super().__init__(partition)
        self.held = 0
        self.second = threading.Event()
        self._lock = threading.Lock()

    def hold(self, partition: int) -> None:
        if partition == self.partition:
            with self._lock:
                self.held += 1
                if self.held >= 2:
                    self.second.set()
        super().hold(partition)


def test_dead_executors_and_speculative_copies_load_every_event_once(spark, cluster, tmp_path):
    cluster, server = cluster
    feed = DemoFeed(partitions=4, events=600, seed=63)
    table = str(tmp_path / "orders")
    pause = tmp_path / "pause"
    pause.mkdir()
    env = {**os.environ, "SPARK_CONNECT_AUTHENTICATE_TOKEN": read_token(server.port), "PYTHONPATH": str(ROOT)}

    def assert_every_event_once() -> None:
        state = read_committed_state(table).state
        for partition in range(4):
            assert payloads(spark, table, partition) == feed.published(partition), f"partition {partition}"
            assert state.get(partition).position == len(feed.published(partition))

    with (
        DemoFeedServer(feed, dialect="published") as feed_server,
        subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("cluster_load.py")),
                feed_server.url,
                table,
                f"sc://localhost:{server.port}",
                str(pause),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        ) as loads,
    ):
        results: queue.Queue[str] = queue.Queue()
        threading.Thread(
            target=lambda: [results.put(line) for line in loads.stdout if line.startswith("{")], daemon=True
        ).start()

        def start_load(command: str = "load") -> None:
            loads.stdin.write(command + "\n")
            loads.stdin.flush()

        def outcome() -> dict:
            try:
                return json.loads(results.get(timeout=600))
            except queue.Empty:
                loads.kill()
                pytest.fail("no load outcome in 10 minutes: " + loads.stderr.read()[-5000:])

        try:
            # 1. the executors die while every read task waits for a page: Spark runs the tasks again on
            #    the executors the workers start instead, and the load commits each event once
            gate = feed_server.gate = Gate()
            start_load()
            assert gate.arrived.wait(240), "no read task fetched a page"
            assert cluster.kill_executors() >= 1
            feed_server.gate = None
            gate.opened.set()
            first = outcome()
            assert first["ok"], first
            assert_every_event_once()

            # 2. the executors die after the load's one Spark job committed the rows and before its state
            #    commit: the state commit (no rows) runs on the executors the workers start instead, and
            #    the next load goes on from it; every event once
            feed.append(200)
            start_load("load-pausing")
            deadline = time.monotonic() + 240
            while not (pause / "rows_committed").exists():
                assert time.monotonic() < deadline and loads.poll() is None, "the load did not commit its rows"
                time.sleep(0.1)
            assert cluster.kill_executors() >= 1
            (pause / "go").touch()
            second = outcome()
            assert second["ok"], second
            assert read_committed_state(table).delta_version > first["version"]
            feed.append(50)
            start_load()
            assert outcome()["ok"]
            assert_every_event_once()

            # 3. a read task that is slow (its partition's pages held) gets a speculative copy on the other
            #    worker; both attempts read the same pages, one attempt's rows are committed, and its read
            #    ends (Spark's observed metrics) are the cursors committed
            feed.append(200)
            gate = feed_server.gate = CountingGate(partition=2)
            start_load()
            speculated = gate.second.wait(240)
            gate.opened.set()
            result = outcome()
            feed_server.gate = None
            assert speculated, "no second attempt of the slow read task ran"
            assert result["ok"], result
            assert_every_event_once()
        finally:
            loads.stdin.close()  # the loader ends after its current load
            try:
                loads.wait(120)
            except subprocess.TimeoutExpired:
                loads.kill()
