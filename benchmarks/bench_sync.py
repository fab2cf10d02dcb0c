#!/usr/bin/env python
"""One feed, one run: raw HTTP reads, a dlt pipeline into Delta, and the project's scheduled sync
through Dagster on the embedded Spark Connect server, cold and warm.

    .venv/bin/python benchmarks/bench_sync.py                        # 16 partitions x 25,000 events
    .venv/bin/python benchmarks/bench_sync.py --events 40000         # quick
    .venv/bin/python benchmarks/bench_sync.py --repeat 3 --keep      # 3 warm runs, keep the temp folder
    .venv/bin/python benchmarks/bench_sync.py --partitions 2000 --events 20000 --page-size 100 --incremental 10
    .venv/bin/python benchmarks/bench_sync.py --lakehouse s3         # the tables on an S3 server
    .venv/bin/python benchmarks/bench_sync.py --protocol nakadi      # a Nakadi event type instead of a feed
    .venv/bin/python benchmarks/bench_sync.py --payload-forms json,variant,columns   # the warm syncs in each form

Needs the `bench` extra (dlt) and the Delta jars (`make setup`); benchmarks/README.md says what each
line measures. In order: the bundled demo feed in its own process (generated once, read by all); raw
HTTP reads (a plain loop, then `--threads` threads); dlt into Delta (`dlt_load.py`, its own process); the same through dagster-dlt (`dagster_dlt_load.py`:
`@dlt_assets` in one `dagster job execute` process, timed from its start to its exit);
the Spark Connect server started (timed), then warmed up as `dg dev` and `feedapi-dagster dev` do
(`orchestration/warm_up.py`: scratch loads in the forms of the syncs; timed; `--no-warm-up` leaves it
cold, as when a run starts the server itself); then `--repeat` + 1 scheduled loads through Dagster, each
into a fresh deployment (a code location `definitions.py` calling `build_feedapi_definitions` on a
`project.json` with one feed `bench`, the lakehouse, a DAGSTER_HOME with the dagster.yaml
feedapi-dagster ships, partitions registered as the discovery sensor does: untimed), timed from the
schedule's tick to the exit of the `dagster api execute_run` process running `feedapi_bench_load` (a
fresh interpreter loading the code location, as with Dagster's default run launcher): the first on the
new server is cold, the others warm. Each run is checked (rows, materializations) and cut into stages
from its events and log lines (`run_hooks/sitecustomize.py`), its start-up (process start to
STEP_START) in parts. With `--incremental N`, N partitions then get 10 new events each and the last
deployment syncs again (the schedule asks for every open partition; N of them have something new).
Peak memory of every process. With `--lakehouse s3`, dlt's table and the project's lakehouse are on
the tests' S3-compatible server (`tests/s3_server.py`, moto's, in its own process on 127.0.0.1).
With `--protocol nakadi` the feed is a Nakadi event type on the bundled Nakadi server (the same
number of events and partitions, no repeated events, so that the rows are the events), read raw and
by dlt through its low-level event stream, and loaded by the project with `protocol: nakadi`.
With `--instance postgres` the Dagster instances keep their runs, events and schedules in PostgreSQL
(dagster-postgres, `storage: postgres:` in dagster.yaml; the other settings as with SQLite) instead of
SQLite files in DAGSTER_HOME: a PostgreSQL 15 server of the benchmark's own (Debian's `postgresql`
package; initdb and pg_ctl run as the `postgres` OS user when the benchmark runs as root) on a free
port of 127.0.0.1, its data in the temp folder, default durability settings (fsync, synchronous
commit), a new database for each deployment.
With `--payload-forms json,variant` the warm syncs run in each of the feed's payload forms, taking turns
(warm #1 json, warm #1 variant, warm #2 json, ...: a change of the machine's load falls on both), the
cold one in the first form; the figures say each form's median warm events/s and their ratio (issue
37's target: variant >= 0.8x json), and a variant table's rows are checked to have their `data`.
Everything started here is stopped at the end.
Exit status 0 when the median warm sync runs at >= 1.5x dlt's events/s, 2 when not, 1 on errors.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import queue
import re
import secrets
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import requests
from procstat import MemoryWatch, proc_cpu, release_spark_port, status_mb, stop_process, tree_cpu, wait_with_usage

from feedapi_dagster.orchestration.demo_commands import PLANNED_SUBSET_ENV
from feedapi_dagster.orchestration.run_storage import listed_partitions

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BIN = Path(sys.executable).parent
TARGET = 1.5  # warm sync / dlt, events per second
DAGSTER_DLT_TARGET = 2.0  # warm sync / dagster-dlt, events per second (issue 38)
FORM_TARGET = 0.8  # `--payload-forms`: a form's warm sync / the first form's (variant / json)
# `--instance postgres`: the server binaries of Debian's `postgresql` package (PostgreSQL 15)
POSTGRES_BIN = Path("/usr/lib/postgresql/15/bin")
POSTGRES_OS_USER = "postgres"  # initdb refuses to run as root: as root, the server runs as this user
INCREMENT = 10  # new events per partition of an incremental sync
NAKADI_EVENT_TYPE = "bench.orders"


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass
class Line:
    """A line of the figures table."""

    name: str
    seconds: float
    events: int | None = None
    rss_mb: float | None = None
    notes: str = ""
    process_seconds: float | None = None  # dlt: its process from start to exit

    @property
    def rate(self) -> float | None:
        return self.events / self.seconds if self.events else None


# ----------------------------------------------------------------------------- 1. feed server
def start_feed_server(protocol: str, partitions: int, events: int, log_path: Path) -> tuple[subprocess.Popen, str]:
    server = (
        ["nakadi-server", "--event-type", NAKADI_EVENT_TYPE, "--duplicate-ratio", "0"]
        if protocol == "nakadi"
        else ["demo-server", "--dialect", "published"]
    )
    command = [
        str(BIN / "feedapi-dagster"),
        *server,
        "--partitions",
        str(partitions),
        "--events",
        str(events),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, cwd=ROOT, start_new_session=True
        )
    url = proc.stdout.readline().decode().strip()  # printed once the feed is generated and the port listens
    if not url.startswith("http"):
        proc.kill()
        raise RuntimeError(f"the feed server printed no URL (exit {proc.wait()}); see {log_path}")
    return proc, url


# ----------------------------------------------------------------------------- 2. raw HTTP
def raw_read(protocol: str, url: str, page_size: int, threads: int) -> int:
    return (raw_read_nakadi if protocol == "nakadi" else raw_read_feedapi)(url, page_size, threads)


def raw_read_nakadi(url: str, page_size: int, threads: int) -> int:
    """Every partition's event stream from BEGIN to the newest offset the listing gave, each batch
    only searched for its cursor; batches."""
    base = f"{url}/event-types/{NAKADI_EVENT_TYPE}"
    listing = requests.get(f"{base}/partitions", timeout=30).json()
    todo: queue.SimpleQueue[dict] = queue.SimpleQueue()
    for partition in listing:
        todo.put(partition)
    batches = [0]

    def reader() -> None:
        with requests.Session() as session:
            while True:
                try:
                    partition = todo.get_nowait()
                except queue.Empty:
                    return
                newest = partition["newest_available_offset"].encode()
                cursors = json.dumps([{"partition": partition["partition"], "offset": "BEGIN"}])
                with session.get(
                    f"{base}/events",
                    headers={"X-Nakadi-Cursors": cursors},
                    stream=True,
                    timeout=60,
                    params={"batch_limit": page_size, "batch_flush_timeout": 1, "stream_timeout": 60},
                ) as response:
                    response.raise_for_status()
                    for line in response.iter_lines(256 * 1024):
                        batches[0] += 1
                        if newest in line[:120]:  # the batch's cursor leads its line
                            break

    in_threads(reader, threads)
    return batches[0]


def raw_read_feedapi(url: str, page_size: int, threads: int) -> int:
    """Every page of every partition from `_first`, each body only searched for its last cursor; pages."""
    document = requests.get(url, timeout=30).json()
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for partition in document["partitions"]:
        todo.put(int(partition["id"]))
    pages = [0]

    def reader() -> None:
        with requests.Session() as session:
            while True:
                try:
                    partition_id = todo.get_nowait()
                except queue.Empty:
                    return
                cursor = "_first"
                while True:
                    response = session.get(
                        f"{url}/events",
                        timeout=60,
                        params={
                            "token": document["token"],
                            "partition": partition_id,
                            "cursor": cursor,
                            "pagesizehint": page_size,
                        },
                    )
                    response.raise_for_status()
                    body = response.content
                    pages[0] += 1
                    start = body.rindex(b'"cursor":"') + len(b'"cursor":"')
                    following = body[start : body.index(b'"', start)].decode()
                    if following == cursor:
                        break  # caught up: a checkpoint-only page that does not advance
                    cursor = following

    in_threads(reader, threads)
    return pages[0]


def in_threads(reader, threads: int) -> None:
    pool = [threading.Thread(target=reader) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


# ----------------------------------------------------------------------------- 3. dlt
def run_dlt(protocol: str, url: str, page_size: int, work: Path, events: int, workers: int, s3: S3Lake | None) -> Line:
    where = ["--bucket-url", f"s3://{s3.bucket}/dlt", "--endpoint", s3.server.url] if s3 else []
    where += ["--nakadi-event-type", NAKADI_EVENT_TYPE] if protocol == "nakadi" else []
    env = {**os.environ, **s3.aws_env()} if s3 else None
    with open(work.parent / "dlt.log", "ab") as log:
        started = time.perf_counter()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-W",
                "ignore",
                str(HERE / "dlt_load.py"),
                url,
                str(page_size),
                str(work),
                str(events),
                "--workers",
                str(workers),
                *where,
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=ROOT,
            env=env,
        )
        out = proc.stdout.read().decode()
        code, rss, cpu = wait_with_usage(proc)
        wall = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"dlt failed (exit {code}): {out.strip()[-500:]}; see {work.parent / 'dlt.log'}")
    result = json.loads(out.strip().splitlines()[-1])
    steps = ", ".join(f"{k} {v:.2f}" for k, v in result["steps"].items())
    return Line(
        f"dlt {result['version']} pipeline.run into Delta",
        result["seconds"],
        events,
        rss,
        f"process {wall:.2f} s, CPU {cpu:.1f} s; {steps}",
        wall,
    )


def run_dagster_dlt(url: str, page_size: int, work: Path, events: int) -> Line:
    """dagster-dlt: `dagster_dlt_load.py`'s `@dlt_assets` job in one `dagster job execute` process (its
    own DAGSTER_HOME, SQLite), timed from process start to exit; the table's rows checked."""
    from deltalake import DeltaTable

    home = work / "dagster_home"
    home.mkdir(parents=True)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "BENCH_FEED_URL": url,
        "BENCH_PAGE_SIZE": str(page_size),
        "BENCH_WORK": str(work),
    }
    command = [
        str(BIN / "dagster"),
        "job",
        "execute",
        "-f",
        str(HERE / "dagster_dlt_load.py"),
        "-j",
        "dagster_dlt_bench",
    ]
    with open(work.parent / "dagster_dlt.log", "ab") as log:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=log, stderr=log, cwd=ROOT, env=env)
        code, rss, cpu = wait_with_usage(proc)
        wall = time.perf_counter() - started
    rows = DeltaTable(str(work / "dlt_lake" / "feed" / "events")).to_pyarrow_dataset().count_rows() if code == 0 else 0
    if code != 0 or rows != events:
        raise RuntimeError(f"dagster-dlt failed (exit {code}, {rows} rows); see {work.parent / 'dagster_dlt.log'}")
    return Line(
        "dagster-dlt (@dlt_assets, `dagster job execute`)", wall, events, rss, f"process start to exit, CPU {cpu:.1f} s"
    )


# ----------------------------------------------------------------------------- 4. Dagster
# The code location of one deployment, written into its folder: what a user's project does with the
# Python factory (`build_feedapi_definitions`), the feeds from `project.json` beside it.
LOCATION = '''"""Code location of a bench_sync.py deployment: the feeds of project.json beside this file."""
from pathlib import Path

from feedapi_dagster.orchestration import ProjectConfig, build_feedapi_definitions

defs = build_feedapi_definitions(ProjectConfig.model_validate_json(Path(__file__).with_name("project.json").read_text()))
'''


@dataclass
class S3Lake:
    """`--lakehouse s3`: the tests' S3-compatible server and a bucket on it."""

    server: object
    bucket: str = "bench"

    def storage(self):
        from feedapi_dagster.spark.storage import S3Storage

        return S3Storage(
            endpoint=self.server.url,
            path_style=True,
            access_key_id_env="FEEDAPI_TEST_S3_KEY",
            secret_access_key_env="FEEDAPI_TEST_S3_SECRET",
        )

    def aws_env(self) -> dict[str, str]:
        return self.storage().credentials()


class PostgresServer:
    """`--instance postgres`: a PostgreSQL server of the benchmark's own, for the Dagster instances'
    storage. `initdb` into `<work>/postgres/data` (as the `postgres` OS user when this runs as root:
    initdb and the server refuse root), the server started by `pg_ctl` listening on 127.0.0.1:`port`
    (its Unix socket in `<work>/postgres`), durability settings left at their defaults (fsync on,
    synchronous commit). The instances connect over TCP as role `dagster` (password, scram-sha-256);
    the benchmark creates their databases as the superuser over the socket (trust)."""

    ROLE = "dagster"

    def __init__(self, work: Path, port: int):
        self.root = work / "postgres"
        self.data = self.root / "data"
        self.log_path = self.root / "server.log"  # the server's own (pg_ctl -l: written as the postgres user)
        self.commands_log = self.root / "commands.log"  # initdb's and pg_ctl's output
        self.port = port
        self.password = secrets.token_hex(16)
        self.started = False
        self.pid: int | None = None
        self.version = ""
        self._as_user: list[str] = []
        self.root.mkdir()
        if os.geteuid() == 0:
            import pwd

            user = pwd.getpwnam(POSTGRES_OS_USER)
            # the work dir is mkdtemp's 0700: the postgres user must pass through it to its own folder
            work.chmod(0o711)
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as_user = ["runuser", "-u", POSTGRES_OS_USER, "--"]
        self.root.chmod(0o700)

    @staticmethod
    def missing() -> str | None:
        """Why the server cannot be started here (None: it can)."""
        needed = [POSTGRES_BIN / name for name in ("initdb", "pg_ctl", "postgres")]
        absent = [str(path) for path in needed if not os.access(path, os.X_OK)]
        if absent:
            return (
                f"--instance postgres needs the PostgreSQL 15 server binaries, not found: {', '.join(absent)}; "
                "install them with `apt-get install postgresql` (Debian's package: /usr/lib/postgresql/15/bin)"
            )
        if importlib.util.find_spec("dagster_postgres") is None:
            return (
                "--instance postgres needs dagster-postgres: "
                '.venv/bin/uv pip install --python .venv/bin/python -e ".[bench]"'
            )
        if os.geteuid() == 0:
            import pwd

            try:
                pwd.getpwnam(POSTGRES_OS_USER)
            except KeyError:
                return (
                    f"--instance postgres as root runs the server as the OS user {POSTGRES_OS_USER!r}, which "
                    "does not exist; `apt-get install postgresql` creates it"
                )
            if shutil.which("runuser") is None:
                return "--instance postgres as root needs `runuser` (util-linux) to run initdb as the postgres user"
        return None

    def _run(self, *command: str) -> None:
        with open(self.commands_log, "ab") as log:
            code = subprocess.run(
                [*self._as_user, *command],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.root,
            ).returncode
        if code != 0:
            tails = [
                f"the end of {path}:\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:])
                for path in (self.commands_log, self.log_path)
                if path.exists()
            ]
            raise RuntimeError(f"{Path(command[0]).name} failed (exit {code}); " + "\n".join(tails))

    def start(self) -> None:
        # "postgres (PostgreSQL) 15.18 (Debian ...)" -> "PostgreSQL 15.18 (Debian ...)"
        self.version = (
            subprocess.run([str(POSTGRES_BIN / "postgres"), "--version"], capture_output=True, text=True, check=True)
            .stdout.strip()
            .replace("postgres (PostgreSQL)", "PostgreSQL")
        )
        password_file = self.root / "superuser-password"
        password_file.write_text(secrets.token_hex(16) + "\n")
        if self._as_user:
            shutil.chown(password_file, POSTGRES_OS_USER)
        password_file.chmod(0o600)
        self._run(
            str(POSTGRES_BIN / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            f"--pwfile={password_file}",
        )
        password_file.unlink()
        # where it listens; everything else (fsync, synchronous_commit, wal_sync_method, shared_buffers,
        # max_connections) stays at initdb's defaults
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\n# bench_sync.py\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.root}'\n"
            )
        self.started = True  # from here on stop() runs pg_ctl stop (a failed start may leave a server)
        self._run(
            str(POSTGRES_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log_path), "-w", "-t", "120", "start"
        )
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        with self._admin() as cursor:
            cursor.execute(f"CREATE ROLE {self.ROLE} LOGIN PASSWORD %s", (self.password,))

    @contextlib.contextmanager
    def _admin(self):
        """A cursor of the superuser over the server's socket (autocommit: CREATE DATABASE)."""
        import psycopg2  # dagster-postgres's driver (the `bench` extra)

        connection = psycopg2.connect(host=str(self.root), port=self.port, user="postgres", dbname="postgres")
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                yield cursor
        finally:
            connection.close()

    def storage(self, database: str) -> dict:
        """A new database owned by the instances' role; dagster.yaml's `storage` block for it
        (dagster-postgres: run, event log and schedule storage in that database)."""
        with self._admin() as cursor:
            cursor.execute(f'CREATE DATABASE "{database}" OWNER {self.ROLE}')
        # `scheme`: the driver dagster-postgres depends on (psycopg2-binary); SQLAlchemy 2.1 maps a bare
        # `postgresql://` to psycopg 3, which nothing here installs (dagster-io/dagster#33958)
        return {
            "postgres": {
                "postgres_db": {
                    "hostname": "127.0.0.1",
                    "port": self.port,
                    "username": self.ROLE,
                    "password": self.password,
                    "db_name": database,
                    "scheme": "postgresql+psycopg2",
                }
            }
        }

    def stop(self) -> None:
        """`pg_ctl stop -m fast` (clients disconnected, a clean shutdown); SIGKILL if that fails."""
        if not self.started:
            return
        self.started = False
        try:
            self._run(str(POSTGRES_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")
        except Exception as error:  # noqa: BLE001 - the server must not outlive the benchmark
            pid_file = self.data / "postmaster.pid"
            pid = int(pid_file.read_text().split()[0]) if pid_file.exists() else self.pid
            if pid is None:
                return  # it never started
            say(f"pg_ctl stop failed ({str(error).splitlines()[0]}); killing the server (pid {pid})")
            try:
                os.killpg(pid, signal.SIGKILL)  # pg_ctl starts it in a session of its own
            except (ProcessLookupError, PermissionError):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def project_config(
    base: Path, protocol: str, url: str, page_size: int, spark_port: int, s3: S3Lake | None, payload_form: str = "json"
):
    """The deployment's feeds configuration: one feed `bench` in `payload_form`, the lakehouse in `base`
    or on S3."""
    from feedapi_dagster.orchestration import FeedConfig, ProjectConfig
    from feedapi_dagster.orchestration.config import StorageConfig
    from feedapi_dagster.spark.settings import SparkSettings

    lakehouse = f"s3a://{s3.bucket}/{base.name}" if s3 else str(base / "lakehouse")
    feed = (
        {"protocol": "nakadi", "url": url, "event_type": NAKADI_EVENT_TYPE}
        if protocol == "nakadi"
        else {"url": url, "dialect": "published"}
    )
    return ProjectConfig(
        lakehouse=lakehouse,
        storage=StorageConfig(s3=s3.storage() if s3 else None),
        spark=SparkSettings(mode="embedded", port=spark_port),
        feeds=[FeedConfig(name="bench", page_size_hint=page_size, payload_form=payload_form, **feed)],
    )


@dataclass
class Setup:
    base: Path
    env: dict[str, str]
    project: object
    binding: object
    defs: object
    location: Path
    instance: object


def prepare(
    base: Path,
    protocol: str,
    url: str,
    page_size: int,
    spark_port: int,
    s3: S3Lake | None,
    storage: dict | None = None,
    payload_form: str = "json",
) -> Setup:
    """A fresh deployment: the code location (definitions.py + project.json), DAGSTER_HOME with the
    instance settings feedapi-dagster ships (plus `storage`, dagster.yaml's block, when given: the
    PostgreSQL database of `--instance postgres`; without it Dagster's default, SQLite files in
    DAGSTER_HOME), the feed's partitions registered as the discovery sensor registers them (untimed)."""
    from importlib.resources import files

    import dagster as dg
    import yaml

    from feedapi_dagster.orchestration import build_feedapi_definitions, feed_bindings
    from feedapi_dagster.orchestration.automation import register_discovered_partitions

    home = base / "dagster_home"
    home.mkdir(parents=True)
    # Dagster's default run launcher and coordinator, the `concurrency` block (pools) of a deployment
    settings = (files("feedapi_dagster.demo") / "dagster.yaml").read_text()
    if storage is not None:
        storage_keys = {"storage", "run_storage", "event_log_storage", "schedule_storage"}
        shipped = storage_keys & set(yaml.safe_load(settings) or {})
        if shipped:
            raise RuntimeError(f"feedapi_dagster/demo/dagster.yaml sets {sorted(shipped)}: --instance would replace it")
        # the shipped settings unchanged, the instance's storage appended
        settings = settings.rstrip("\n") + "\n" + yaml.safe_dump({"storage": storage}, sort_keys=False)
    (home / "dagster.yaml").write_text(settings)
    project = project_config(base, protocol, url, page_size, spark_port, s3, payload_form)
    location = base / "location"
    location.mkdir()
    (location / "project.json").write_text(project.model_dump_json(exclude_defaults=True, indent=2))
    (location / "definitions.py").write_text(LOCATION)
    os.environ["DAGSTER_HOME"] = str(home)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE / "run_hooks"), os.environ.get("PYTHONPATH")])),
    }
    binding = next(feed_bindings(project))[0]
    instance = dg.DagsterInstance.get()
    register_discovered_partitions(instance, binding)
    # the bench process evaluates the schedule and creates the run from the same definitions the
    # code location builds (the run process loads them from definitions.py)
    return Setup(base, env, project, binding, build_feedapi_definitions(project), location, instance)


@dataclass
class Run:
    line: Line
    label: str = ""  # its column in the tables of stages: cold, warm #1 (json)...
    run_id: str = ""
    payload_form: str = "json"
    stages: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    startup: dict[str, float] = field(default_factory=dict)


def run_sync(
    setup: Setup, name: str, events: int, spark_pid: int, changed: int | None = None, postgres_pid: int | None = None
) -> Run:
    """The schedule's tick and the run of `feedapi_bench_load` it requests, in a `dagster api execute_run`
    process (a fresh interpreter that loads the code location, as Dagster's default run launcher
    starts a run); checked: `events` rows in the table, a materialization for each of `changed`
    partitions (None: all), `events` counted as the run's. `postgres_pid`: the instance's PostgreSQL
    server, whose CPU (postmaster, background processes, backends) is counted too."""
    import dagster as dg
    from dagster._core.definitions.reconstruct import ReconstructableRepository
    from dagster._grpc.types import ExecuteRunArgs
    from dagster._serdes import serialize_value

    binding = setup.binding
    job_name = binding.job_name
    instance = setup.instance
    spark_cpu = tree_cpu(spark_pid)
    postgres_cpu = sum(tree_cpu(postgres_pid)) if postgres_pid is not None else 0.0
    tick_started = time.perf_counter()
    schedule = setup.defs.resolve_schedule_def(f"feedapi_{binding.name}_schedule")
    with dg.build_schedule_context(instance=instance) as context:
        data = schedule.evaluate_tick(context)
    if not data.run_requests:
        raise RuntimeError(f"the schedule requested no run: {data.skip_message}")
    request = data.run_requests[0]
    origin = (
        ReconstructableRepository.for_file(
            str(setup.location / "definitions.py"), "defs", working_directory=str(setup.location)
        )
        .get_reconstructable_job(job_name)
        .get_python_origin()
    )
    run = instance.create_run_for_job(
        setup.defs.resolve_job_def(job_name),
        run_config=dict(request.run_config),
        tags={**request.tags, "dagster/schedule_name": schedule.name},
        job_code_origin=origin,
    )
    args = ExecuteRunArgs(
        job_origin=run.job_code_origin,
        run_id=run.run_id,
        instance_ref=instance.get_ref(),
        set_exit_code_on_failure=True,
    )
    tick = time.perf_counter() - tick_started
    log_path = setup.base / "run.log"
    with open(log_path, "wb") as log:
        started = time.time()
        proc = subprocess.Popen(
            [str(BIN / "dagster"), "api", "execute_run", serialize_value(args)],
            env=setup.env,
            cwd=setup.location,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        code, rss, cpu = wait_with_usage(proc)
        ended = time.time()
    if code != 0 or not instance.get_run_by_id(run.run_id).is_success:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"the Dagster run failed (exit {code}); the end of {log_path}:\n{tail}")
    verify(setup, run.run_id, events, changed)
    seconds = tick + ended - started
    jvm, workers = tree_cpu(spark_pid)
    result = Run(
        Line(name, seconds, events, rss, f"run process {ended - started:.2f} s"),
        run_id=run.run_id,
        cpu={
            "run process": cpu,
            "Spark server JVM": jvm - spark_cpu[0],
            "Spark's Python workers (below the JVM)": workers - spark_cpu[1],
        },
    )
    if postgres_pid is not None:
        # backends that exited count in the postmaster's waited-for children
        result.cpu["PostgreSQL server (postmaster + backends)"] = sum(tree_cpu(postgres_pid)) - postgres_cpu
    result.stages, result.startup = stages(instance, run.run_id, log_path, tick, started, ended)
    if STARTUP in result.stages:
        result.line.notes += f", run start-up {result.stages[STARTUP]:.2f} s"
    return result


def measure_store_event(instance: object, run_id: str) -> Line:
    """Dagster's own bookkeeping of a run, timed alone: every event the run stored (materializations,
    planned events, check results, log lines, step and run events) stored again into the same instance,
    under a run id of its own, one `DagsterInstance.store_event` each, as the run's process stored them
    (Dagster's default: no batching). The instance then holds a run's worth of events more: call it
    once the runs on it are over."""
    from dagster._core.utils import make_new_run_id

    events = list(instance.all_logs(run_id))
    copy_id = make_new_run_id()
    seconds = {"ASSET_MATERIALIZATION": 0.0, "other": 0.0}
    counts = {"ASSET_MATERIALIZATION": 0, "other": 0}
    for event in events:
        kind = (
            "ASSET_MATERIALIZATION"
            if event.dagster_event and event.dagster_event.event_type_value == ("ASSET_MATERIALIZATION")
            else "other"
        )
        started = time.perf_counter()
        instance.store_event(event._replace(run_id=copy_id))
        seconds[kind] += time.perf_counter() - started
        counts[kind] += 1
    materializations = counts["ASSET_MATERIALIZATION"]
    each = 1000 * seconds["ASSET_MATERIALIZATION"] / max(1, materializations)
    return Line(
        "Dagster's store_event alone: the last run's events stored again",
        sum(seconds.values()),
        notes=(
            f"{len(events)} events; {materializations} materializations {seconds['ASSET_MATERIALIZATION']:.2f} s "
            f"({each:.1f} ms each), {counts['other']} others {seconds['other']:.2f} s"
        ),
    )


def verify(setup: Setup, run_id: str, events: int, changed: int | None) -> None:
    """All events in the table, one materialization per partition that changed, the read tasks' notes
    removed, the run tagged with every partition."""
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    path = setup.binding.table_path
    dataset = DeltaTable(path, storage_options=setup.project.storage_options() or None).to_pyarrow_dataset()
    rows = dataset.count_rows()
    # a variant table: every row has its payload parsed (the demo feeds' payloads all parse)
    if (
        setup.binding.feed.payload_form == "variant"
        and (parsed := dataset.count_rows(filter=ds.field("data").is_valid())) != rows
    ):
        raise RuntimeError(f"run {run_id}: {rows - parsed} of {rows} rows have no `data`")
    # a columns table: no value rescued (each load's columns are inferred from its own rows)
    if (
        setup.binding.feed.payload_form == "columns"
        and (rescued := dataset.count_rows(filter=ds.field("_rescued_data").is_valid())) != 0
    ):
        raise RuntimeError(f"run {run_id}: {rescued} of {rows} rows have rescued values")
    partitions = setup.instance.get_dynamic_partitions(setup.binding.partitions_name)
    materialized = [
        e
        for e in setup.instance.all_logs(run_id)
        if e.dagster_event is not None and e.dagster_event.event_type_value == "ASSET_MATERIALIZATION"
    ]
    left = list((Path(path) / "_feedapi_progress").glob("load-*")) if "://" not in path else []
    tags = setup.instance.get_run_by_id(run_id).tags
    listed = listed_partitions(tags)
    materializations = len(partitions) if changed is None else changed
    if (
        rows != events
        or len(materialized) != materializations
        or left
        or (listed is not None and listed != {int(p) for p in partitions})
    ):
        raise RuntimeError(
            f"run {run_id}: {rows} rows (expected {events}), {len(materialized)} materializations "
            f"(expected {materializations}), read notes left: {left}, tag feedapi/partitions "
            f"{tags.get('feedapi/partitions')!r}"
        )


STARTUP = "process start, imports, Dagster run start-up"


def stages(
    instance, run_id: str, log_path: Path, tick: float, started: float, ended: float
) -> tuple[dict[str, float], dict[str, float]]:
    """The run's wall time in consecutive stages, from Dagster's event timestamps, the run's log lines
    and the marks of run_hooks/sitecustomize.py; and the run start-up (process start to STEP_START) in
    parts. A stage whose mark is missing is merged into the one before it."""
    events = {}
    marks: dict[str, float] = {}
    for entry in instance.all_logs(run_id):
        if entry.dagster_event is not None:
            events.setdefault(entry.dagster_event.event_type.name, entry.timestamp)
            continue
        # the loader's progress lines, in the run's own log (FeedLoader logs to `context.log`)
        message, at = entry.user_message, entry.timestamp
        read = re.search(r"read and written by Spark as Delta version \d+ in ([0-9.]+) s", message)
        quiet = re.search(r": nothing new \(Spark's read took ([0-9.]+) s", message)
        # a kept read (a columns table's sync): read and kept first, then one commit of the rows and state
        kept = re.search(r"\]: read and kept by Spark in ([0-9.]+) s", message)
        if read or quiet or kept:
            marks.setdefault("read start", at - float((read or quiet or kept).group(1)))
            marks.setdefault("read end", at)
        if quiet or re.match(r"(cursors of partitions|committed partitions) .* (as|of) Delta version", message):
            marks["commit end"] = at
    for text in log_path.read_text(errors="replace").splitlines():
        if text.startswith("BENCH "):
            _, at, _, message = text.split(" ", 3)
            if message.startswith("mark "):
                words = message.split()
                marks.setdefault(f"{words[1]} {words[2]}", float(at))
    if not {"STEP_START", "STEP_SUCCESS"} <= events.keys():
        return {}, {}
    points = [
        (STARTUP, started),
        ("Spark client: pyspark import + Connect session", events["STEP_START"]),
        ("feedapi data source registered in the session", marks.get("connect end")),
        ("table check/creation (CREATE TABLE IF NOT EXISTS)", marks.get("table start")),
        ("discovery, planning (Delta log read by delta-rs)", marks.get("table end")),
        (
            "the Spark job: feed read and written to Delta (rows commit) + history check; kept: read and kept",
            marks.get("read start"),
        ),
        (
            "read ends (observed), their state read from the rows (a state commit where they cannot say it); kept: the commit (columns: shapes, typed write)",
            marks.get("read end"),
        ),
        ("Dagster: materializations, mirror check", marks.get("commit end")),
        ("asset checks (positions, duplicate ids, cursor mirror)", marks.get("checks start")),
        ("maintenance check (OPTIMIZE/VACUUM due?)", marks.get("maintenance start")),
        ("Dagster step end, run end (to RUN_SUCCESS)", marks.get("maintenance end")),
        ("process exit: Dagster's teardown, exit hooks", events.get("RUN_SUCCESS")),
        ("process exit: interpreter teardown", marks.get("exit hooks")),
        ("", ended),
    ]
    points = [(label, at) for label, at in points if at is not None]
    result = {"schedule tick (evaluation, run created; bench process)": tick}
    result.update({label: max(0.0, points[i + 1][1] - at) for i, (label, at) in enumerate(points[:-1])})
    # the start-up in parts: the interpreter (until sitecustomize runs), `dagster api execute_run`'s own
    # imports (until the code location imports feedapi_dagster), the code location loaded (imports of
    # feedapi_dagster, dagster-pyspark, pyspark's modules it needs; the definitions built), Dagster's run
    # start (instance, run and plan until RUN_START, then the step's start)
    parts = [
        ("interpreter start (until sitecustomize)", started),
        ("dagster CLI imports (until the code location loads)", marks.get("python start")),
        ("code location load (imports, definitions built)", marks.get("location start")),
        ("Dagster run start (instance, run, plan: to RUN_START)", marks.get("definitions end")),
        ("RUN_START to STEP_START (resources, step start)", events.get("RUN_START")),
        ("", events["STEP_START"]),
    ]
    parts = [(label, at) for label, at in parts if at is not None]
    startup = {label: max(0.0, parts[i + 1][1] - at) for i, (label, at) in enumerate(parts[:-1])}
    return result, startup


def start_spark(port: int, work: Path, s3: S3Lake | None, class_archive: bool = True):
    """The embedded server as a deployment's first run would start it (the lakehouse's s3a settings and
    credentials come with each run's session, not with the server); `class_archive`: mapping the class
    archive `setup-jars` trained (`spark/class_archive.py`)."""
    from feedapi_dagster.spark.connect_server import port_open
    from feedapi_dagster.spark.embedded import ensure_embedded_server

    if port_open(port):
        raise RuntimeError(f"port {port} is taken")
    settings = project_config(work, "feedapi", "http://127.0.0.1/feed", 1, port, s3).spark
    return ensure_embedded_server(
        port, work_dir=work, conf=settings.conf, class_archive="installed" if class_archive else None
    )


def measure_floors(port: int, url: str, page_size: int, events: int, table_path: str, work: Path) -> list[Line]:
    """The floor of the sync's Spark job on the same server after the syncs (warm), from the bench
    process as a Spark Connect client of the runs' session, each twice (the second counts): the feed
    read by the `feedapi` data source alone (Spark's `noop` sink: HTTP, parsing, the Arrow hand-off from
    the Python workers), the same rows copied from the last sync's table into a new Delta table (the
    Parquet and Delta write with no Python), and the data source's read written to Delta (the job's
    own work with no cursor state, no progress notes, no Dagster)."""
    from feedapi_dagster import FeedDataSource
    from feedapi_dagster.spark.connect_server import SparkConnectServer
    from feedapi_dagster.spark.sessions import connect_session

    spark = connect_session(SparkConnectServer.attach(port).client_url())
    spark.dataSource.register(FeedDataSource)

    def read():
        return spark.read.format("feedapi").option("url", url).option("pageSizeHint", str(page_size)).load()

    jobs = {
        "Spark floor: the feed read alone (feedapi source, noop sink)": lambda n: (
            read().write.format("noop").mode("overwrite").save()
        ),
        "Spark floor: the sync's rows copied into a new Delta table": lambda n: (
            spark.read.format("delta").load(table_path).write.format("delta").save(str(work / f"floor-copy-{n}"))
        ),
        "Spark floor: the feed read and written to Delta, no state": lambda n: (
            read().write.format("delta").save(str(work / f"floor-job-{n}"))
        ),
    }
    lines = []
    for name, job in jobs.items():
        seconds = []
        for attempt in range(2):
            started = time.perf_counter()
            job(attempt)
            seconds.append(time.perf_counter() - started)
        lines.append(Line(name, seconds[-1], events, notes=f"first {seconds[0]:.2f} s"))
        say(f"  {name}: {seconds[0]:.2f} / {seconds[1]:.2f} s")
    return lines


def report(
    args: argparse.Namespace,
    lines: list[Line],
    runs: list[Run],
    incremental: list[Run],
    watch: MemoryWatch,
    spark_peaks: dict[str, float],
    instance: str,
) -> float:
    """Prints the figures; returns warm sync / dlt (events/s)."""
    raw_loop = lines[0]
    dlt_line = next(line for line in lines if line.name.startswith("dlt"))
    forms = list(dict.fromkeys(run.payload_form for run in runs[1:]))
    warm_rates = {
        form: statistics.median(run.line.rate for run in runs[1:] if run.payload_form == form) for form in forms
    }
    warm = [run.line for run in runs[1:] if run.payload_form == forms[0]]
    warm_rate = warm_rates[forms[0]]
    print()
    print(
        f"{args.partitions} partitions, {args.events} events, page size hint {args.page_size}; "
        f"{os.cpu_count()} cores, load average {load_average()}; {time.strftime('%Y-%m-%d %H:%M')}; "
        f"{PLANNED_SUBSET_ENV}={os.environ.get(PLANNED_SUBSET_ENV)}; lakehouse on {args.lakehouse}; "
        f"protocol {args.protocol}; Dagster instance on {instance}"
    )
    print(f"{'':<58} {'seconds':>8} {'events/s':>10} {'/ dlt':>6} {'/ raw':>6} {'max RSS MB':>10}")
    for line in [*lines, *(run.line for run in runs + incremental)]:
        rate = (
            ""
            if line.rate is None
            else f"{line.rate:10,.0f} {line.rate / dlt_line.rate:6.2f} {line.rate / raw_loop.rate:6.2f}"
        )
        rss = "" if line.rss_mb is None else f"{line.rss_mb:10.0f}"
        print(f"{line.name:<58} {line.seconds:8.2f} {rate:<24} {rss}   {line.notes}")
    ratio = warm_rate / dlt_line.rate
    print(
        f"{'warm sync / dlt (median of ' + str(len(warm)) + ' warm runs)':<58} {ratio:8.2f}   target >= {TARGET}: "
        f"{'met' if ratio >= TARGET else 'MISSED'}"
    )
    print(
        f"{'warm sync / dlt process (start to exit, imports included)':<58} "
        f"{warm_rate / (dlt_line.events / dlt_line.process_seconds):8.2f}"
    )
    if dagster_dlt := next((line for line in lines if line.name.startswith("dagster-dlt")), None):
        versus = warm_rate / dagster_dlt.rate
        print(
            f"{'warm sync / dagster-dlt (its process, start to exit)':<58} {versus:8.2f}   target >= "
            f"{DAGSTER_DLT_TARGET}: {'met' if versus >= DAGSTER_DLT_TARGET else 'MISSED'}"
        )
    print(f"{'warm sync / raw HTTP plain loop':<58} {warm_rate / raw_loop.rate:8.2f}")
    for form in forms[1:]:
        form_ratio = warm_rates[form] / warm_rate
        print(
            f"{f'payload_form {form} / {forms[0]} (median warm events/s)':<58} {form_ratio:8.2f}   "
            f"{warm_rates[form]:,.0f} / {warm_rate:,.0f} events/s; target >= {FORM_TARGET}: "
            f"{'met' if form_ratio >= FORM_TARGET else 'MISSED'}"
        )

    print(
        "\nWhere a run's time goes (seconds; consecutive stages adding up to the run's figure; the log "
        "lines round to 0.1 s):"
    )
    names = [run.label for run in runs] + (["increm."] if incremental else [])
    runs = runs + incremental
    width = max(9, *(len(name) + 1 for name in names))  # a column per run
    header = f"  {'':<58}" + "".join(f"{name:>{width}}" for name in names)
    print(header)
    for label in dict.fromkeys(label for run in runs for label in run.stages):
        print(f"  {label:<58}" + "".join(f"{run.stages.get(label, float('nan')):{width}.2f}" for run in runs))
    print(f"  {'total':<58}" + "".join(f"{run.line.seconds:{width}.2f}" for run in runs))
    print(
        f"\nRun start-up ('{STARTUP}': process start to STEP_START; Dagster's default launcher, no fork "
        "server), in parts:"
    )
    print(header)
    for label in dict.fromkeys(label for run in runs for label in run.startup):
        print(f"  {label:<58}" + "".join(f"{run.startup.get(label, float('nan')):{width}.2f}" for run in runs))
    print(f"  {'run start-up':<58}" + "".join(f"{run.stages.get(STARTUP, float('nan')):{width}.2f}" for run in runs))
    print("CPU seconds during each run:")
    for key in runs[0].cpu:
        print(f"  {key:<58}" + "".join(f"{run.cpu[key]:{width}.1f}" for run in runs))

    print("\nMemory (MB; peak resident set):")
    print(f"  feed server: {watch.root_peak.get('feed server', 0):.0f}")
    print(f"  dlt process: {dlt_line.rss_mb:.0f}")
    print(
        "  Dagster run process: "
        + ", ".join(f"{name} {run.line.rss_mb:.0f}" for name, run in zip(names, runs, strict=True))
    )
    print("  Spark server JVM (its peak so far): " + ", ".join(f"{k} {v:.0f}" for k, v in spark_peaks.items()))
    workers = watch.child_peak.get("Spark server", {})
    if workers:
        print(
            f"  Spark's Python workers (below the JVM): {len(workers)} processes seen, largest sum in one "
            f"sample {watch.children_sum['Spark server']:.0f} (forked workers share pages; the sum counts "
            "them in each); by command:"
        )
        kinds: dict[str, list[float]] = {}
        for pid, peak in workers.items():
            words = watch.kinds.get(pid, "?").split()
            kinds.setdefault(
                " ".join(words[2:4]) if words[1:2] == ["-m"] else " ".join([Path(words[0]).name, *words[1:2]]), []
            ).append(peak)
        for kind, peaks in sorted(kinds.items(), key=lambda item: -max(item[1])):
            print(f"    {kind}: {len(peaks)} processes, largest {max(peaks):.0f}")
    print(f"\ncommand: {shlex.join(['.venv/bin/python', 'benchmarks/bench_sync.py', *sys.argv[1:]])}")
    return ratio


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--events", type=int, default=400_000, help="in all (spread over the partitions)")
    parser.add_argument("--page-size", type=int, default=5000, help="the feed's page_size_hint")
    parser.add_argument("--threads", type=int, default=8, help="threads of the second raw read, and dlt's workers")
    parser.add_argument(
        "--no-warm-up",
        action="store_true",
        help="the cold run on a server nobody warmed (as when a run starts the server itself)",
    )
    parser.add_argument(
        "--no-class-archive",
        action="store_true",
        help="the server started without the class archive `setup-jars` trained (as before issue #48)",
    )
    parser.add_argument("--repeat", type=int, default=2, help="warm runs (each into a fresh table)")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (tables, logs, DAGSTER_HOMEs)")
    parser.add_argument(
        "--lakehouse",
        choices=("local", "s3"),
        default="local",
        help="the tables (dlt's and the project's) on local disk or on an S3 server",
    )
    parser.add_argument(
        "--protocol",
        choices=("feedapi", "nakadi"),
        default="feedapi",
        help="the feed: a FeedAPI feed (published dialect) or a Nakadi event type",
    )
    parser.add_argument(
        "--instance",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="the Dagster instances' storage: SQLite files in DAGSTER_HOME, or a PostgreSQL 15 "
        "server started here (dagster-postgres)",
    )
    parser.add_argument(
        "--incremental",
        type=int,
        default=0,
        metavar="N",
        help="then append 10 events to each of N partitions and sync the last deployment again",
    )
    parser.add_argument(
        "--payload-forms",
        default="json",
        help="the feed's payload_form of the syncs, comma-separated (json,variant,columns: the warm syncs in each, "
        "taking turns; the cold one in the first)",
    )
    args = parser.parse_args(argv)
    forms = args.payload_forms.split(",")
    if not forms or set(forms) - {"json", "variant", "columns"} or len(set(forms)) != len(forms):
        parser.error("--payload-forms: json, variant and/or columns, each once (json,variant,columns)")
    if args.incremental and args.protocol != "feedapi":
        parser.error("--incremental appends to given partitions: FeedAPI's demo server only")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if args.instance == "postgres" and PostgresServer.missing():
        print(f"bench_sync.py: {PostgresServer.missing()}", file=sys.stderr)
        return 1
    # SIGTERM as ctrl-C: the cleanup below runs (the feed and PostgreSQL servers are in sessions of their own)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    # what README "Thousands of partitions" tells a deployment to set where runs are created (daemon,
    # webserver): one ASSET_MATERIALIZATION_PLANNED event per run instead of one per partition key
    os.environ.setdefault(PLANNED_SUBSET_ENV, "true")
    from procstat import find_free_port

    work = Path(tempfile.mkdtemp(prefix="bench-sync-"))
    say(f"work dir {work}; {os.cpu_count()} cores; load average {load_average()}")
    watch = MemoryWatch()
    feed = spark = s3 = postgres = None
    instance = "SQLite (files in DAGSTER_HOME)"
    spark_port = find_free_port()
    lines: list[Line] = []
    runs: list[Run] = []
    incremental: list[Run] = []
    spark_peaks: dict[str, float] = {}
    try:
        if args.lakehouse == "s3":
            sys.path.insert(0, str(ROOT))
            from tests.s3_server import TEST_CREDENTIALS, S3Server

            os.environ.update(TEST_CREDENTIALS)  # the names the storage setting gives
            s3 = S3Lake(S3Server(log_path=work / "s3-server.log"))
            s3.server.create_bucket(s3.bucket)
            watch.watch("S3 server", s3.server.pid)
            say(f"S3 server (moto) {s3.server.url}, bucket {s3.bucket}")
        if args.instance == "postgres":
            postgres_port = find_free_port()
            while postgres_port == spark_port:
                postgres_port = find_free_port()
            started = time.perf_counter()
            postgres = PostgresServer(work, postgres_port)
            postgres.start()
            instance = f"{postgres.version} on 127.0.0.1:{postgres_port}, a database per deployment"
            say(
                f"{postgres.version} on 127.0.0.1:{postgres_port} (pid {postgres.pid}, data {postgres.data}): "
                f"ready after {time.perf_counter() - started:.1f} s"
            )
        started = time.perf_counter()
        feed, url = start_feed_server(args.protocol, args.partitions, args.events, work / "feed-server.log")
        watch.watch("feed server", feed.pid)
        say(
            f"feed server {url}: {args.partitions} partitions, {args.events} events, ready after "
            f"{time.perf_counter() - started:.1f} s"
        )

        for threads, name in (
            (1, "raw HTTP read, a plain loop"),
            (args.threads, f"raw HTTP read, {args.threads} threads"),
        ):
            say(f"{name}; load average {load_average()}")
            feed_cpu, started = proc_cpu(feed.pid), time.perf_counter()
            pages = raw_read(args.protocol, url, args.page_size, threads)
            lines.append(
                Line(
                    name,
                    time.perf_counter() - started,
                    args.events,
                    notes=f"{pages} pages; feed server CPU {proc_cpu(feed.pid) - feed_cpu:.1f} s",
                )
            )
            say(f"  {lines[-1].seconds:.2f} s: {lines[-1].rate:,.0f} events/s")

        say(f"dlt; load average {load_average()}")
        (work / "dlt").mkdir()
        dlt_line = run_dlt(args.protocol, url, args.page_size, work / "dlt", args.events, args.threads, s3)
        lines.append(dlt_line)
        say(f"  {dlt_line.seconds:.2f} s: {dlt_line.rate:,.0f} events/s")
        if args.protocol == "feedapi" and s3 is None:
            say(f"dagster-dlt; load average {load_average()}")
            lines.append(run_dagster_dlt(url, args.page_size, work / "dagster_dlt", args.events))
            say(f"  {lines[-1].seconds:.2f} s: {lines[-1].rate:,.0f} events/s")

        say(f"starting the Spark Connect server on port {spark_port}; load average {load_average()}")
        started = time.perf_counter()
        spark = start_spark(spark_port, work / "spark", s3, class_archive=not args.no_class_archive)
        lines.append(Line("Spark Connect server start (until it listens)", time.perf_counter() - started))
        watch.watch("Spark server", spark.pid)
        spark_peaks["after start"] = status_mb(spark.pid) or 0.0
        say(f"  ready after {lines[-1].seconds:.1f} s (pid {spark.pid})")
        if not args.no_warm_up:
            from feedapi_dagster.orchestration.warm_up import warm_up

            say(f"warming the server up, as `feedapi-dagster dev` and `dg dev` do; load average {load_average()}")
            started = time.perf_counter()
            warm_up(spark_port, forms)
            lines.append(Line("Spark server warm-up (scratch loads, before any run)", time.perf_counter() - started))
            spark_peaks["after the warm-up"] = status_mb(spark.pid) or 0.0
            say(f"  warmed in {lines[-1].seconds:.1f} s")

        # the cold sync in the first form, then each warm one in every form in turn
        turns = [(0, forms[0])] + [(index, form) for index in range(1, args.repeat + 1) for form in forms]
        for turn, (index, form) in enumerate(turns):
            label = "cold" if index == 0 else f"warm #{index}" + (f" {form}" if len(forms) > 1 else "")
            name = (
                "Dagster scheduled sync, cold (1st run on the new server)"
                if index == 0
                else f"Dagster scheduled sync, {label}"
            ) + (f", payload_form {form}" if len(forms) > 1 and index == 0 else "")
            storage = postgres.storage(f"dagster_run_{turn}") if postgres else None  # a database per deployment
            setup = prepare(
                work / f"run-{turn}", args.protocol, url, args.page_size, spark_port, s3, storage, payload_form=form
            )
            say(f"{name}; load average {load_average()}")
            run = run_sync(setup, name, args.events, spark.pid, postgres_pid=postgres and postgres.pid)
            run.label, run.payload_form = label, form
            if turn == len(turns) - 1:
                say(f"Dagster's store_event alone, the last run's events again; load average {load_average()}")
                lines.append(measure_store_event(setup.instance, run.run_id))
                say(f"  {lines[-1].seconds:.2f} s ({lines[-1].notes})")
            if not (args.incremental and turn == len(turns) - 1):  # the incremental sync goes on with it
                setup.instance.dispose()
            runs.append(run)
            spark_peaks["after the cold run" if index == 0 else label] = status_mb(spark.pid) or 0.0
            say(f"  {run.line.seconds:.2f} s: {run.line.rate:,.0f} events/s ({run.line.notes}); verified")
        if args.incremental:
            for partition in range(args.incremental):
                requests.post(
                    url.rsplit("/feed", 1)[0] + "/admin/append",
                    json={"count": INCREMENT, "partition": partition},
                    timeout=30,
                ).raise_for_status()
            name = f"Dagster scheduled sync, incremental ({args.incremental} partitions x {INCREMENT} new)"
            say(f"{name}; load average {load_average()}")
            run = run_sync(
                setup,
                name,
                args.events + args.incremental * INCREMENT,
                spark.pid,
                changed=args.incremental,
                postgres_pid=postgres and postgres.pid,
            )
            run.line.events = args.incremental * INCREMENT
            setup.instance.dispose()
            incremental.append(run)
            say(f"  {run.line.seconds:.2f} s ({run.line.notes}); verified")
        if args.protocol == "feedapi" and s3 is None:
            say(f"the floor of the Spark job, on the same server; load average {load_average()}")
            lines.extend(measure_floors(spark_port, url, args.page_size, args.events, setup.binding.table_path, work))
        watch.sample()
    except Exception:  # noqa: BLE001 - reported, exit 1
        traceback.print_exc()
        return 1
    finally:
        watch.stop()
        if postgres is not None:
            postgres.stop()
        stop_process(feed)
        if s3 is not None:
            s3.server.stop()
        if spark is not None:
            spark.stop()
        if strays := release_spark_port(spark_port):
            say(f"stopped a Spark server that a run started on port {spark_port}: {strays}")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    ratio = report(args, lines, runs, incremental, watch, spark_peaks, instance)
    return 0 if ratio >= TARGET else 2


if __name__ == "__main__":
    sys.exit(main())
