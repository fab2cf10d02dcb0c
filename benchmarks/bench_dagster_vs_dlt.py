#!/usr/bin/env python
"""One feed, three readers, one run: raw HTTP, a dlt pipeline into Delta, and a scheduled Dagster sync.

    .venv/bin/python benchmarks/bench_dagster_vs_dlt.py                     # 16 x 25,000 events
    .venv/bin/python benchmarks/bench_dagster_vs_dlt.py --events-per-partition 5000   # quick
    .venv/bin/python benchmarks/bench_dagster_vs_dlt.py --writer spark      # Spark writes the table

Needs the `bench` extra (`uv pip install -e ".[bench]"`: dlt with deltalake) and, for `--writer spark`,
the Delta jars (`make setup`). Steps (see benchmarks/README.md):

1. the bundled demo feed (`feedapi-dagster demo-server --dialect published`) runs in its own process
   with P partitions and P*E events (`--events` is the total; events spread over partitions by
   aggregate, so partitions are only roughly even);
2. raw baselines: every page of every partition from `_first`, each body only searched for its last
   cursor line; events/s = N / seconds. Two of them: **a plain loop** (one thread, one
   `requests.Session`, partition after partition), the issue's baseline ("a plain HTTP read of the same
   pages runs at about 300k events/s"), against which the 0.60 target is judged; and a stricter one,
   8 threads with a `requests.Session` each, reported next to it;
3. dlt: one `parallelized=True` resource per partition, each paging through its partition and
   yielding one `pyarrow.Table` per page (partition_id, position, cursor, payload = raw JSON text of
   `data`, parsed with msgspec or `--dlt-parser json`), `write_disposition="append"` into the
   `filesystem` destination with `table_format="delta"` in a temp folder; `pipeline.run` is timed end
   to end and the Delta table must hold N rows;
4. Dagster: a temp feeds file (lakehouse in tmp, `writer: deltalake|spark` from `--writer`, embedded
   Spark on a free port, one feed `bench`), a temp DAGSTER_HOME with the project's dagster.yaml,
   partitions registered as the discovery sensor does. With `writer: deltalake` (the default) the run
   writes through delta-rs and needs no Spark session: no Spark server is started, and one that
   appears on the feeds file's port during the run is an error. With `writer: spark` the Spark Connect
   server is started (and warmed by a small load into another table) before the clock starts, as in
   production where it is already running. Timed: the schedule's evaluation and the run it requests,
   launched in a subprocess the way Dagster launches runs (`dagster job execute`: one run process, the
   sync job's in-process executor running the op in it; `--launch api`: the run created in the
   instance and `dagster api execute_run` started, as Dagster's default run launcher does; or
   `--launch inprocess`: a process doing
   `execute_in_process`), so process start, imports (and for Spark, the Spark client) are paid inside
   the timing. Verified afterwards, with `deltalake` for either writer: N rows and positions 0..n-1
   per partition in the Delta table, one materialization per partition with `cursor` metadata;
5. one table of figures and ratios (the lower median of `--repeat` runs; ratios within each
   repetition), then where the Dagster run's time went: the run's event-log timestamps plus spans
   recorded by a `sitecustomize` hook installed through PYTHONPATH in the run's processes
   (`--no-profile` runs without it), summed into consecutive stages.

Measured changes (none changes the package; each is a flag):

* `--writer spark`: the feed table written by the Spark session (`SparkEngine`) instead of delta-rs;
* `--pycache DIR`: the run's processes get a bytecode cache (PYTHONPYCACHEPREFIX), as every deployment
  without PYTHONDONTWRITEBYTECODE (or installed with `uv pip install --compile-bytecode`) has;
* `--spark-conf KEY=VALUE` (with `--writer spark`): configuration of the Spark Connect server started
  here (e.g. C2 JIT);
* `--load KEY=VALUE`: the feed's `load` settings (batch_events, read_processes, ...).

Everything started here (feed server, Spark server) is stopped at the end; the temp folder is
removed unless `--keep`. Exit status 0 when both ratios meet their targets, 2 when not, 1 on errors.
"""
from __future__ import annotations

import argparse
import warnings
import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import requests

from feedapi_dagster.lakehouse.spark import find_free_port
from procstat import proc_cpu

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DLT_RATIO_TARGET = 2.0
RAW_RATIO_TARGET = 0.60
RAW_THREADS = 8  # the stricter baseline; the is a plain loop (1 thread)


# ----------------------------------------------------------------------------- helpers
def children_cpu() -> float:
    usage = os.times()
    return usage.children_user + usage.children_system


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class Figure:
    name: str
    events: int
    seconds: float
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds per process during the figure

    @property
    def rate(self) -> float:
        return self.events / self.seconds


class CpuMeter:
    """CPU seconds spent by named processes (and this process, and its waited-for children) in a block."""

    def __init__(self, pids: dict[str, int | None]):
        self.pids = pids
        self.result: dict[str, float] = {}

    def __enter__(self) -> "CpuMeter":
        self._start = {name: proc_cpu(pid) for name, pid in self.pids.items()}
        times = os.times()
        self._self = times.user + times.system
        self._children = children_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        for name, pid in self.pids.items():
            now, before = proc_cpu(pid), self._start[name]
            if now is not None and before is not None:
                self.result[name] = now - before
        times = os.times()
        self.result["bench process"] = times.user + times.system - self._self
        spent = children_cpu() - self._children
        if spent > 0.005:
            self.result["subprocesses"] = spent


# ----------------------------------------------------------------------------- 1. feed server
class FeedServer:
    """`feedapi-dagster demo-server` in its own process (its own GIL), stopped by SIGTERM."""

    def __init__(self, partitions: int, events: int, log_path: Path):
        self.partitions, self.events, self.log_path = partitions, events, log_path
        self.port = find_free_port()
        self.url = f"http://127.0.0.1:{self.port}/feed"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 600.0) -> "FeedServer":
        command = [str(BIN / "feedapi-dagster"), "demo-server", "--host", "127.0.0.1", "--port", str(self.port),
                   "--dialect", "published", "--partitions", str(self.partitions), "--events", str(self.events)]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=ROOT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the feed server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if requests.get(self.url, timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the feed server did not answer within {timeout:.0f} s; see {self.log_path}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self.proc = None


def discover(url: str) -> tuple[str, list[int]]:
    document = requests.get(url, timeout=30).json()
    return document["token"], [int(p["id"]) for p in document["partitions"]]


# ----------------------------------------------------------------------------- 2. raw baseline
def last_cursor(body: bytes) -> str:
    start = body.rfind(b'"cursor":"')
    if start < 0:
        raise RuntimeError(f"no cursor line in a page: {body[-200:]!r}")
    start += len(b'"cursor":"')
    return body[start:body.index(b'"', start)].decode()


def raw_read(url: str, page_size: int, threads: int = RAW_THREADS) -> tuple[int, int]:
    """Every page of every partition from `_first`; returns (pages, bytes)."""
    token, partition_ids = discover(url)
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for pid in partition_ids:
        todo.put(pid)
    totals = [0, 0]
    lock = threading.Lock()

    def worker() -> None:
        pages = size = 0
        with requests.Session() as session:
            while True:
                try:
                    pid = todo.get_nowait()
                except queue.Empty:
                    break
                cursor = "_first"
                while True:
                    response = session.get(f"{url}/events", params={"token": token, "partition": pid, "cursor": cursor,
                                                                    "pagesizehint": page_size}, timeout=60)
                    response.raise_for_status()
                    body = response.content
                    pages += 1
                    size += len(body)
                    following = last_cursor(body)
                    if following == cursor:
                        break  # caught up: a checkpoint-only page that does not advance
                    cursor = following
        with lock:
            totals[0] += pages
            totals[1] += size

    pool = [threading.Thread(target=worker, name=f"raw-{i}") for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return totals[0], totals[1]


# ----------------------------------------------------------------------------- 3. dlt
class _Line(msgspec.Struct):
    """A published-dialect line: an event (`data`, kept as raw JSON text) or a checkpoint (`cursor`)."""

    data: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    cursor: str | None = None


def dlt_partition_pages(url: str, token: str, partition_id: int, page_size: int, parser: str):
    """What a dlt user would write: page through one partition, one Arrow table per page."""
    import pyarrow as pa

    decoder = msgspec.json.Decoder(_Line)
    cursor, position = "_first", 0
    with requests.Session() as session:
        while True:
            response = session.get(f"{url}/events", params={"token": token, "partition": partition_id,
                                                            "cursor": cursor, "pagesizehint": page_size}, timeout=60)
            response.raise_for_status()
            payloads: list[str] = []
            cursors: list[str] = []
            pending: list[str] = []
            following = cursor
            if parser == "msgspec":
                for line in decoder.decode_lines(response.content):
                    if line.data is not msgspec.UNSET:
                        pending.append(bytes(line.data).decode())
                    elif line.cursor is not None:
                        following = line.cursor
                        cursors.extend([following] * len(pending))
                        payloads.extend(pending)
                        pending = []
            else:
                for text in response.content.splitlines():
                    if not text.strip():
                        continue
                    line = json.loads(text)
                    if "data" in line:
                        pending.append(json.dumps(line["data"], ensure_ascii=False, separators=(",", ":")))
                    elif "cursor" in line:
                        following = line["cursor"]
                        cursors.extend([following] * len(pending))
                        payloads.extend(pending)
                        pending = []
            if payloads:
                count = len(payloads)
                yield pa.table({
                    "partition_id": pa.array([partition_id] * count, pa.int32()),
                    "position": pa.array(range(position, position + count), pa.int64()),
                    "cursor": pa.array(cursors, pa.string()),
                    "payload": pa.array(payloads, pa.string()),
                })
                position += count
            if following == cursor:
                return
            cursor = following


def run_dlt(url: str, page_size: int, work: Path, parser: str, expected: int) -> tuple[Figure, list[str]]:
    os.environ["DLT_DATA_DIR"] = str(work / "dlt_data")
    os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")
    os.environ.setdefault("EXTRACT__WORKERS", str(RAW_THREADS))  # parallelized resources: 8 threads like raw
    import dlt
    from dlt.common.libs.deltalake import get_delta_tables

    token, partition_ids = discover(url)
    resources = [
        dlt.resource(dlt_partition_pages, name=f"feed_partition_{pid}", table_name="events",
                     write_disposition="append", table_format="delta", parallelized=True)(url, token, pid, page_size,
                                                                                           parser)
        for pid in partition_ids
    ]
    pipeline = dlt.pipeline(pipeline_name="bench_feed", pipelines_dir=str(work / "dlt_pipelines"),
                            destination=dlt.destinations.filesystem(bucket_url=(work / "dlt_lake").as_uri()),
                            dataset_name="feed", progress=None)
    started = time.perf_counter()
    pipeline.run(resources)
    seconds = time.perf_counter() - started
    table = get_delta_tables(pipeline, "events")["events"]
    rows = table.to_pyarrow_dataset().count_rows()
    if rows != expected:
        raise RuntimeError(f"dlt: the Delta table holds {rows} rows, expected {expected}")
    notes = [f"dlt {dlt.__version__}: Delta table {table.table_uri} holds {rows} rows (version {table.version()})"]
    trace = pipeline.last_trace
    for step in trace.steps if trace else []:
        if step.started_at and step.finished_at:
            notes.append(f"  {step.step:<10} {(step.finished_at - step.started_at).total_seconds():7.2f} s")
    return Figure("dlt pipeline.run (filesystem, delta)", rows, seconds), notes


# ----------------------------------------------------------------------------- 4. Dagster
# Installed in the run's processes (through PYTHONPATH) unless --no-profile: records spans of the
# load's stages into $BENCH_PROFILE_FILE, patching modules as they are imported.
PROFILE_HOOKS = r'''
import importlib.abc, json, os, sys, threading, time

_FILE = os.environ.get("BENCH_PROFILE_FILE")
_LOCK = threading.Lock()


def span(name, start, end=None, **extra):
    if not _FILE:
        return
    record = {"pid": os.getpid(), "thread": threading.current_thread().name, "name": name, "start": start,
              "end": time.time() if end is None else end, **extra}
    with _LOCK, open(_FILE, "a") as handle:
        handle.write(json.dumps(record) + "\n")


span("interpreter ready", time.time())


def timed(owner, attribute, name):
    original = getattr(owner, attribute)

    def wrapper(*args, **kwargs):
        start = time.time()
        try:
            return original(*args, **kwargs)
        finally:
            span(name, start)

    wrapper.__wrapped__ = original
    setattr(owner, attribute, wrapper)


def _spark(module):
    original = module.connect_session

    def connect_session(*args, **kwargs):
        start = time.time()
        import pyspark.sql.connect.session  # noqa: F401 - timed on its own
        span("import pyspark (Connect client)", start)
        start = time.time()
        try:
            return original(*args, **kwargs)
        finally:
            span("Spark Connect session (getOrCreate)", start)

    module.connect_session = connect_session
    timed(module, "ensure_embedded_server", "ensure_embedded_server (port check)")


def _state(module):
    timed(module, "read_history", "history read (read_history)")


def _engines(module):
    timed(module.DeltaRsEngine, "ensure_table", "ensure_table (create if missing)")
    timed(module.SparkEngine, "ensure_table", "ensure_table (create if missing)")
    timed(module.DeltaRsEngine, "write", "Delta write + commit (delta-rs)")
    timed(module.SparkEngine, "write", "Delta write + commit (Spark)")
    timed(module.SparkEngine, "_frame", "createDataFrame(Arrow)")  # inside SparkEngine.write


def _table(module):
    timed(module.EventBatch, "to_arrow", "rows to Arrow (EventBatch.to_arrow)")


def _sink(module):
    timed(module.DeltaSink, "event_ids", "stored event ids (dedup read)")
    timed(module.DeltaSink, "_landed", "commit check (history read)")
    timed(module.DeltaSink, "compact_if_due", "compact_if_due (history + OPTIMIZE)")


def _loader(module):
    timed(module, "plan_feed", "plan_feed")
    timed(module.FeedLoader, "_flush", "flush (Arrow + commit)")
    timed(module.FeedLoader, "sync", "FeedLoader.sync")
    add_page, write_loop = module.FeedLoader._add_group, module.FeedLoader._write_loop
    spent = threading.local()

    def _add_group(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return add_page(self, *args, **kwargs)
        finally:
            spent.add_page = getattr(spent, "add_page", 0.0) + time.perf_counter() - start

    def _write_loop(self, *args, **kwargs):
        spent.add_page = 0.0
        start = time.time()
        try:
            return write_loop(self, *args, **kwargs)
        finally:
            span("write loop (row groups to batches, commits)", start, add_page_seconds=spent.add_page)

    module.FeedLoader._add_group, module.FeedLoader._write_loop = _add_group, _write_loop


def _client(module):
    timed(module.FeedClient, "discover", "discovery (GET /feed)")
    pages = module.FeedClient.pages

    def wrapped(self, partition_id, *args, **kwargs):
        iterator = pages(self, partition_id, *args, **kwargs)
        start, busy, count, events = time.time(), 0.0, 0, 0
        try:
            while True:
                began = time.perf_counter()
                try:
                    page = next(iterator)
                except StopIteration:
                    busy += time.perf_counter() - began
                    return
                busy += time.perf_counter() - began
                count += 1
                events += len(page.raw_events)
                yield page
        finally:
            span("fetch partition (HTTP + NDJSON)", start, partition=partition_id, busy=busy, pages=count,
                 events=events)

    module.FeedClient.pages = wrapped


def _assets(module):
    timed(module, "active_partitions", "active_partitions (run query)")
    timed(module, "_register_partitions", "register dynamic partitions")
    timed(module, "make_loader", "make_loader (table engine + sink)")
    timed(module, "materializations", "build materializations")


def _resources(module):
    timed(module.SparkResource, "session", "SparkResource.session")


_PATCHES = {
    "feedapi_dagster.lakehouse.spark": _spark,
    "feedapi_dagster.lakehouse.engines": _engines,
    "feedapi_dagster.lakehouse.table": _table,
    "feedapi_dagster.lakehouse.state": _state,
    "feedapi_dagster.lakehouse.sink": _sink,
    "feedapi_dagster.lakehouse.loader": _loader,
    "feedapi_dagster.protocol.client": _client,
    "feedapi_dagster.orchestration.assets": _assets,
    "feedapi_dagster.orchestration.resources": _resources,
    "deltalake": None,
    "pandas": None,  # pyarrow imports it on the first pa.array() of a Python list
    "dagster_project.definitions": None,
    "dagster": None,
}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        execute, patch = spec.loader.exec_module, _PATCHES[name]

        def exec_module(module):
            start = time.time()
            execute(module)
            if patch is not None:
                patch(module)
            span(f"import {name}", start)

        spec.loader.exec_module = exec_module
        return spec


if _FILE:
    sys.meta_path.insert(0, _Finder())
'''


@dataclass
class DagsterSetup:
    work: Path
    home: Path
    config_path: Path
    env: dict[str, str]
    project: object
    defs: object
    instance: object
    profile_file: Path | None


def prepare_dagster(work: Path, url: str, page_size: int, writer: str, spark_port: int, index: int, profile: bool,
                    pycache: Path | None, load: dict[str, int]) -> DagsterSetup:
    """Feeds file, DAGSTER_HOME and partitions registered as the discovery sensor does (untimed)."""
    import dagster as dg
    import yaml

    base = work / f"dagster-{index}"
    home = base / "dagster_home"
    home.mkdir(parents=True)
    shutil.copy(ROOT / "dagster_project" / "dagster.yaml", home / "dagster.yaml")
    config_path = base / "feeds.yaml"
    config_path.write_text(yaml.safe_dump({
        "lakehouse": str(base / "lakehouse"),
        "spark": {"mode": "embedded", "port": spark_port},
        "writer": writer,
        "feeds": [{"name": "bench", "url": url, "dialect": "published", "page_size_hint": page_size,
                   **({"load": load} if load else {})}],
    }, sort_keys=False))
    os.environ["FEEDAPI_DAGSTER_CONFIG"] = str(config_path)
    os.environ["DAGSTER_HOME"] = str(home)
    env = {**os.environ, "FEEDAPI_DAGSTER_CONFIG": str(config_path), "DAGSTER_HOME": str(home)}
    env.pop("FEEDAPI_LAKEHOUSE", None)
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    profile_file = None
    if profile:
        site = work / "profile_site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(PROFILE_HOOKS)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
        profile_file = base / "profile.jsonl"
        env["BENCH_PROFILE_FILE"] = str(profile_file)

    from feedapi_dagster.orchestration import build_definitions, load_config
    from feedapi_dagster.orchestration.automation import register_discovered_partitions

    project = load_config(config_path)
    defs = build_definitions(project)
    instance = dg.DagsterInstance.get()
    register_discovered_partitions(instance, project.feeds[0])
    return DagsterSetup(base, home, config_path, env, project, defs, instance, profile_file)


WARM_UP = r'''
import sys
from feedapi_dagster.lakehouse.engines import SparkEngine
from feedapi_dagster.lakehouse.loader import FeedLoader
from feedapi_dagster.lakehouse.sink import DeltaSink
from feedapi_dagster.lakehouse.spark import connect_session
from feedapi_dagster.orchestration import load_config

project = load_config(sys.argv[1])
feed = project.feeds[0]
spark = connect_session(f"sc://127.0.0.1:{project.spark.port}")
path = sys.argv[2]
loader = FeedLoader(feed.client(), DeltaSink(path, engine=SparkEngine(spark, path)), feed.load)
partitions = [p.id for p in loader.client.info.partitions][: int(sys.argv[3])]
reports = loader.sync(partitions)
print("warm-up loaded", sum(r.events for r in reports.values()), "events")
'''


def warm_up(setup: DagsterSetup, partitions: int) -> float:
    """`--writer spark`: a small load through the same code into another table: the long-running server
    has JIT-compiled and loaded Delta's classes, as it has in production after its first runs (untimed)."""
    started = time.perf_counter()
    env = {k: v for k, v in setup.env.items() if k != "BENCH_PROFILE_FILE"}
    subprocess.run([sys.executable, "-W", "ignore", "-c", WARM_UP, str(setup.config_path),
                    str(setup.work / "warmup_table"), str(partitions)], env=env, cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


IN_PROCESS_RUN = r'''
import json, sys
import dagster as dg
import yaml
from dagster_project.definitions import defs

run_config = yaml.safe_load(open(sys.argv[2]))
with dg.DagsterInstance.get() as instance:
    result = defs.get_job_def(sys.argv[1]).execute_in_process(run_config=run_config, tags=json.loads(sys.argv[3]),
                                                             instance=instance, raise_on_error=False)
sys.exit(0 if result.success else 1)
'''


@dataclass
class DagsterRun:
    figure: Figure
    command: list[str]
    run_id: str
    started_wall: float
    spawned_wall: float
    launch_marks: dict[str, float]  # --launch launcher: when the run was created, when launch_run returned
    ended_wall: float
    evaluation_seconds: float
    log_path: Path


def run_dagster(setup: DagsterSetup, launch: str, expected: int, cpu_pids: dict[str, int | None],
                verify: bool = True) -> DagsterRun:
    """The schedule's tick and its run, timed; `verify`: the run loaded the whole feed (its first run)."""
    import dagster as dg
    import yaml

    feed = setup.project.feeds[0]
    job_name = f"feedapi_{feed.name}_sync"
    run_config_path = setup.work / "run_config.yaml"
    log_path = setup.work / "run.log"
    with CpuMeter(cpu_pids) as meter, open(log_path, "wb") as log_file:
        started_wall, started = time.time(), time.perf_counter()
        schedule = setup.defs.resolve_schedule_def(f"feedapi_{feed.name}_schedule")
        with dg.build_schedule_context(instance=setup.instance) as context:
            data = schedule.evaluate_tick(context)
        if not data.run_requests:
            raise RuntimeError(f"the schedule requested no run: {data.skip_message}")
        request = data.run_requests[0]
        tags = {**request.tags, "dagster/schedule_name": schedule.name}
        run_config_path.write_text(yaml.safe_dump(dict(request.run_config)))
        evaluation_seconds = time.perf_counter() - started
        if launch == "cli":
            command = [str(BIN / "dagster"), "job", "execute", "-m", "dagster_project.definitions", "-j", job_name,
                       "-c", str(run_config_path), "--tags", json.dumps(tags)]
        elif launch == "api":
            command = api_run_command(setup, job_name, dict(request.run_config), tags)
        elif launch == "inprocess":
            command = [sys.executable, "-c", IN_PROCESS_RUN, job_name, str(run_config_path), json.dumps(tags)]
        else:
            command = [f"{type(setup.instance.run_launcher).__name__}.launch_run"]
        spawned_wall = time.time()
        launch_marks: dict[str, float] = {}
        if launch == "launcher":
            run_id = create_run(setup, job_name, dict(request.run_config), tags).run_id
            launch_marks["run created in the instance (bench process)"] = time.time()
            setup.instance.launch_run(run_id, workspace=None)
            launch_marks["launch_run returned: worker forked (bench process)"] = time.time()
            code = wait_for_run(setup.instance, run_id)
        else:
            code = subprocess.run(command, env=setup.env, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL).returncode
        seconds = time.perf_counter() - started
        ended_wall = time.time()
    if code != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"the Dagster run failed (exit {code}); the end of {log_path}:\n{tail}")
    runs = setup.instance.get_runs(dg.RunsFilter(job_name=job_name), limit=1)
    if not runs or not runs[0].is_success:
        raise RuntimeError(f"no successful run of {job_name} in {setup.home}; see {log_path}")
    run_id = runs[0].run_id
    if verify:
        verify_dagster(setup, run_id, expected)
    how = {"inprocess": "execute_in_process", "api": "dagster api execute_run", "cli": "dagster job execute",
           "launcher": f"the instance's {command[0]}"}[launch]
    figure = Figure(f"Dagster scheduled sync ({how}, writer {setup.project.writer})", expected, seconds,
                    meter.result)
    return DagsterRun(figure, command, run_id, started_wall, spawned_wall, launch_marks, ended_wall,
                      evaluation_seconds, log_path)


def create_run(setup: DagsterSetup, job_name: str, run_config: dict, tags: dict):
    """The run of a schedule's request in the instance, with the code origin a code server gives it."""
    from dagster._core.definitions.reconstruct import ReconstructableRepository

    origin = (ReconstructableRepository.for_module("dagster_project.definitions", "defs", working_directory=str(ROOT))
              .get_reconstructable_job(job_name).get_python_origin())
    return setup.instance.create_run_for_job(setup.defs.get_job_def(job_name), run_config=run_config, tags=tags,
                                             job_code_origin=origin)


def api_run_command(setup: DagsterSetup, job_name: str, run_config: dict, tags: dict) -> list[str]:
    """What Dagster's default run launcher does for a scheduled run: create the run in the instance, then
    have the code server start `dagster api execute_run` with the run's origin (no CLI result context)."""
    from dagster._grpc.types import ExecuteRunArgs
    from dagster._serdes import serialize_value

    run = create_run(setup, job_name, run_config, tags)
    args = ExecuteRunArgs(job_origin=run.job_code_origin, run_id=run.run_id, instance_ref=setup.instance.get_ref(),
                          set_exit_code_on_failure=True)
    return [str(BIN / "dagster"), "api", "execute_run", serialize_value(args)]


def start_fork_server(setup: DagsterSetup, log_path: Path) -> float:
    """`--launch launcher`: the run launcher's fork server started and its imports done before the clock,
    as in a daemon that has launched a run before; its processes write to `log_path` (untimed)."""
    import multiprocessing

    started = time.perf_counter()
    saved_env, saved_fds = dict(os.environ), [os.dup(1), os.dup(2)]
    with open(log_path, "ab") as log_file:
        os.environ.clear()
        os.environ.update(setup.env)
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
        try:
            setup.instance.run_launcher.start_fork_server()
            probe = multiprocessing.get_context("forkserver").Process(target=os.getpid)
            probe.start()  # returns once the fork server has imported its modules and forked
            probe.join()
        finally:
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            os.environ.clear()
            os.environ.update(saved_env)
    return time.perf_counter() - started


def wait_for_run(instance, run_id: str, timeout: float = 600.0) -> int:
    """Polls the run's status as the UI does; 0 when it succeeded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run.is_finished:
            return 0 if run.is_success else 1
        time.sleep(0.02)
    raise RuntimeError(f"run {run_id} did not finish in {timeout:.0f} s")


def verify_dagster(setup: DagsterSetup, run_id: str, expected: int) -> None:
    import dagster as dg
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    feed = setup.project.feeds[0]
    table = DeltaTable(setup.project.table_path(feed)).to_pyarrow_table(columns=["partition_id", "position"])
    if table.num_rows != expected:
        raise RuntimeError(f"Dagster: the Delta table holds {table.num_rows} rows, expected {expected}")
    counts = table.group_by("partition_id").aggregate([("position", "count"), ("position", "max")])
    broken = pc.sum(pc.not_equal(pc.add(counts["position_max"], 1), counts["position_count"])).as_py()
    if broken:
        raise RuntimeError(f"Dagster: {broken} partitions have positions that are not 0..n-1")
    key = dg.AssetKey(["feedapi", feed.name])
    partition_keys = setup.instance.get_dynamic_partitions(f"feedapi_{feed.name}")
    for partition_key in partition_keys:
        records = setup.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition_key]), limit=10).records
        if len(records) != 1 or records[0].run_id != run_id:
            raise RuntimeError(f"Dagster: partition {partition_key} has {len(records)} materializations, expected "
                               f"one by run {run_id}")
        cursor = records[0].asset_materialization.metadata.get("cursor")
        if cursor is None or not cursor.value:
            raise RuntimeError(f"Dagster: the materialization of partition {partition_key} has no cursor metadata")
    if len(partition_keys) != len(counts):
        raise RuntimeError(f"Dagster: {len(partition_keys)} partitions registered, {len(counts)} in the table")


def stop_stray_spark_server(port: int) -> list[int]:
    """`writer: deltalake` needs no Spark: a Spark Connect server the run started (detached) on the feeds
    file's port is stopped here; returns its pids (the port is a free one picked by this benchmark)."""
    marker = f"spark.connect.grpc.binding.port={port}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in arguments:
            found.append(int(entry.name))
    for pid in found:
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGTERM)
            else:
                os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    return found


# ----------------------------------------------------------------------------- 5. the Dagster breakdown
_MILESTONES = ("RUN_START", "STEP_WORKER_STARTING", "STEP_WORKER_STARTED", "RESOURCE_INIT_STARTED",
               "RESOURCE_INIT_SUCCESS", "STEP_START", "STEP_SUCCESS", "RUN_SUCCESS")


def dagster_breakdown(setup: DagsterSetup, run: DagsterRun) -> list[str]:
    t0 = run.started_wall
    rows: list[tuple[float, float | None, str]] = []  # (start offset, duration, what)
    rows.append((0.0, run.evaluation_seconds, "schedule evaluation (bench process)"))
    rows.append((run.spawned_wall - t0, None, "run subprocess spawned"))
    rows.extend((at - t0, None, what) for what, at in run.launch_marks.items())
    materialized = []
    milestones: dict[str, float] = {}
    for entry in setup.instance.all_logs(run.run_id):
        event = entry.dagster_event
        at = entry.timestamp - t0
        if event is None:
            if entry.user_message.startswith("partition "):
                materialized.append(at)
            continue
        kind = event.event_type.name  # the enum's name: RUN_START is stored as PIPELINE_START
        if kind in _MILESTONES:
            rows.append((at, None, f"event {kind}"))
            milestones.setdefault(kind, entry.timestamp)
        elif kind == "ASSET_MATERIALIZATION":
            materialized.append(at)
    if materialized:
        rows.append((min(materialized), max(materialized) - min(materialized),
                     f"partition log lines + materializations ({len(materialized)} events)"))
    rows.append((run.ended_wall - t0, None, "run subprocess exited"))

    pids: dict[int, str] = {}
    spans = []
    if setup.profile_file and setup.profile_file.exists():
        for line in setup.profile_file.read_text().splitlines():
            record = json.loads(line)
            if record["start"] >= t0:  # the file holds every run of this DAGSTER_HOME
                spans.append(record)
    # the run process imports the code location first, the step process (if any) second; helpers
    # (multiprocessing's resource tracker, orphan watchers) only report that their interpreter is up
    for record in sorted(spans, key=lambda r: r["start"]):
        if record["name"] == "import dagster_project.definitions" and record["pid"] not in pids:
            pids[record["pid"]] = "step process" if pids else "run process"
    readers = sorted({r["pid"] for r in spans if r["name"].startswith("fetch partition")} - set(pids))
    pids.update({pid: "reader processes" for pid in readers})  # read_processes > 0: fetch + derive + Arrow
    spans = [s for s in spans if s["pid"] in pids]
    fetches = [s for s in spans if s["name"].startswith("fetch partition")]
    grouped: dict[tuple[int, str], list[dict]] = {}
    for record in spans:
        if record in fetches:
            continue
        grouped.setdefault((record["pid"], record["name"]), []).append(record)
    for (pid, name), records in grouped.items():
        first = min(r["start"] for r in records)
        total = sum(r["end"] - r["start"] for r in records)
        label = f"{pids[pid]}: {name}" + (f" (x{len(records)})" if len(records) > 1 else "")
        extra = records[-1].get("add_page_seconds")
        if extra is not None:
            label += f" [of which groups to batch {extra:.2f} s]"
        rows.append((first - t0, total if name != "interpreter ready" else None, label))
    if fetches:
        start, end = min(s["start"] for s in fetches), max(s["end"] for s in fetches)
        busy = sum(s["busy"] for s in fetches)
        pages = sum(s["pages"] for s in fetches)
        rows.append((start - t0, end - start,
                     f"{pids[fetches[0]['pid']]}: fetch of {len(fetches)} partitions ({pages} checkpoint groups; "
                     f"fetch threads busy {busy:.2f} s in HTTP + NDJSON, GIL waits included)"))
    rows.sort(key=lambda r: r[0])
    lines = [f"Dagster run {run.run_id} ({run.figure.seconds:.2f} s; times from the clock start; log: {run.log_path}):",
             f"  {'at s':>7}  {'took s':>7}  what"]
    for at, took, what in rows:
        lines.append(f"  {at:7.2f}  {'' if took is None else f'{took:7.2f}':>7}  {what}")
    if len(pids) > 1:
        lines.append("  (a step process: the op ran in a process of its own, not in the run process)")
    lines += time_summary(run, milestones, spans)
    return lines


def time_summary(run: DagsterRun, milestones: dict[str, float], spans: list[dict]) -> list[str]:
    """The run's wall time cut into consecutive stages that add up to the figure."""
    op = [s for s in spans if s["name"] == "FeedLoader.sync"]
    if not op or "STEP_START" not in milestones:
        return []
    pid = op[0]["pid"]

    def total(name: str) -> float:
        return sum(s["end"] - s["start"] for s in spans if s["pid"] == pid and s["name"] == name)

    def first(name: str) -> float | None:
        starts = [s["start"] for s in spans if s["pid"] == pid and s["name"] == name]
        return min(starts) if starts else None

    t0, end = run.started_wall, run.ended_wall
    step_start, step_end = milestones["STEP_START"], milestones.get("STEP_SUCCESS", end)
    session, create = total("SparkResource.session"), total("ensure_table (create if missing)")
    dedup = total("stored event ids (dedup read)")
    loops = [s for s in spans if s["pid"] == pid and s["name"] == "write loop (row groups to batches, commits)"]
    write_loop = sum(s["end"] - s["start"] for s in loops)
    add_page = sum(s.get("add_page_seconds", 0.0) for s in loops)
    flush = total("flush (Arrow + commit)")
    frame = total("createDataFrame(Arrow)")  # nested in the Spark write
    arrow = total("rows to Arrow (EventBatch.to_arrow)")
    writes = total("Delta write + commit (delta-rs)") + total("Delta write + commit (Spark)")
    check = total("commit check (history read)")
    history = total("history read (read_history)") - check  # minus the reads nested in commit checks
    compact = total("compact_if_due (history + OPTIMIZE)")
    in_step = step_end - step_start
    accounted = session + create + history + dedup + write_loop + compact
    stages = [
        ("schedule evaluation (instance queries, bench process)", run.evaluation_seconds),
        ("process start, imports, Dagster run start-up", step_start - run.spawned_wall),
        ("Spark client (pyspark import + Connect session; writer spark only)", session),
        ("table check / creation (engine ensure_table)", create),
        ("history reads before the load (read_history)", history),
        ("stored event ids (dedup read)", dedup),
        ("waiting for pages (HTTP + NDJSON not overlapped by the write loop)", write_loop - flush - add_page),
        ("row groups to batch (FeedLoader._add_group; derive + Arrow run in the readers)", add_page),
        ("createDataFrame(Arrow) (writer spark only)", frame),
        ("Delta write + commit", writes - frame),
        ("commit checks (history read after each commit)", check),
        ("rest of the flushes (stamping rows, encoding the state)", flush - writes - check),
        ("compact_if_due (history + OPTIMIZE)", compact),
        ("rest of the op (instance queries, discovery, logs, materializations)", in_step - accounted),
        ("run end: step/run events, process exit", end - step_end),
    ]
    seconds = end - t0
    lines = ["", f"Where the {seconds:.2f} s of this run went (consecutive stages):"]
    for label, value in stages:
        lines.append(f"  {label:<68} {value:7.2f} s  {100 * value / seconds:5.1f} %")
    lines.append(f"  {'(spawn gap: schedule evaluated -> subprocess started)':<68} "
                 f"{run.spawned_wall - t0 - run.evaluation_seconds:7.2f} s")
    lines.append(f"  {'(reader threads, overlapping the stages: rows to Arrow, EventBatch.to_arrow)':<68} {arrow:7.2f} s")
    first_fetch = first("fetch partition (HTTP + NDJSON)")
    if first_fetch is not None:
        lines.append(f"  first page requested {first_fetch - t0:.2f} s after the clock started")
    return lines


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--events-per-partition", type=int, default=25000)
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--writer", choices=("deltalake", "spark"), default="deltalake",
                        help="`writer:` of the feeds file: deltalake (delta-rs in the run process, no Spark server "
                             "started) or spark (the embedded Spark Connect server started here writes)")
    parser.add_argument("--launch", choices=("launcher", "cli", "api", "inprocess"), default="launcher",
                        help="launcher: the run created in the instance and launched by the instance's run "
                             "launcher (the project's dagster.yaml: ForkServerRunLauncher, its fork server warm), "
                             "as the daemon launches a scheduled run; "
                             "cli: `dagster job execute` (a run process; the sync job's in-process executor runs "
                             "the op in it); api: the run created in the instance and `dagster api execute_run` "
                             "started, as the default run launcher does; inprocess: one process calling "
                             "execute_in_process")
    parser.add_argument("--dlt-parser", choices=("msgspec", "json"), default="msgspec")
    parser.add_argument("--spark-conf", metavar="KEY=VALUE", action="append", default=[],
                        help="with --writer spark: configuration of the Spark Connect server started here, e.g. "
                             "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=4 (C2 JIT)")
    parser.add_argument("--load", metavar="KEY=VALUE", action="append", default=[],
                        help="the feed's `load` settings in the feeds file (batch_events, read_processes, ...)")
    parser.add_argument("--pycache", metavar="DIR", type=Path,
                        help="give the Dagster processes a bytecode cache (PYTHONPYCACHEPREFIX=DIR, warmed before "
                             "the clock): what a deployment has when PYTHONDONTWRITEBYTECODE is not set")
    parser.add_argument("--warm-partitions", type=int, default=1,
                        help="with --writer spark: partitions the untimed Spark warm-up loads into another table "
                             "(0: no warm-up)")
    parser.add_argument("--repeat", type=int, default=1, help="measure each figure this many times (median)")
    parser.add_argument("--no-profile", action="store_true", help="no span hooks in the Dagster processes")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (tables, logs, DAGSTER_HOME)")
    args = parser.parse_args(argv)
    if args.spark_conf and args.writer != "spark":
        parser.error("--spark-conf configures the Spark server started for --writer spark")
    warnings.filterwarnings("ignore", message=r".*is currently in beta")
    spark_conf = dict(item.split("=", 1) for item in args.spark_conf)
    load_settings = {key: int(value) for key, value in (item.split("=", 1) for item in args.load)}
    events = args.partitions * args.events_per_partition
    command_line = shlex.join([Path(sys.executable).name, *sys.argv])

    work = Path(tempfile.mkdtemp(prefix="bench-dagster-vs-dlt-"))
    say(f"work dir {work}; load average {load_average()}; {os.cpu_count()} cores")
    feed_server = FeedServer(args.partitions, events, work / "feed-server.log")
    spark_server = None
    spark_port: int | None = None
    figures: dict[str, list[Figure]] = {"raw_loop": [], "raw": [], "dlt": [], "dagster": []}
    notes: list[str] = []
    breakdowns: list[list[str]] = []
    runs: list[DagsterRun] = []
    try:
        started = time.perf_counter()
        feed_server.start()
        say(f"feed server {feed_server.url}: {args.partitions} partitions, {events} events "
            f"(ready after {time.perf_counter() - started:.1f} s)")

        # the feeds file names a free port either way; with writer deltalake nothing may listen on it
        spark_port = find_free_port()
        if args.writer == "spark":
            from feedapi_dagster.lakehouse.spark import ensure_embedded_server

            started = time.perf_counter()
            spark_server = ensure_embedded_server(spark_port, conf=spark_conf, work_dir=work / "spark", detach=True)
            say(f"Spark Connect server {spark_server.url} ready after {time.perf_counter() - started:.1f} s "
                f"(pid {spark_server.pid})")
        else:
            say(f"writer deltalake: no Spark server (the feeds file's port {spark_port} must stay closed)")
        if args.pycache is not None:
            args.pycache.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "PYTHONPYCACHEPREFIX": str(args.pycache)}
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            started = time.perf_counter()
            modules = "dagster_project.definitions, yaml, deltalake, feedapi_dagster.lakehouse.engines" + (
                ", pyspark.sql.connect.session" if args.writer == "spark" else "")
            subprocess.run([sys.executable, "-W", "ignore", "-c", f"import {modules}"],
                           env={**env, "FEEDAPI_DAGSTER_CONFIG": str(ROOT / "dagster_project" / "feeds.yaml")},
                           cwd=ROOT, check=True)
            say(f"bytecode cache {args.pycache} warm ({time.perf_counter() - started:.1f} s)")
        cpu_pids = {"feed server": feed_server.pid}
        if spark_server is not None:
            cpu_pids["Spark server (JVM)"] = spark_server.pid

        idle_seconds: list[float] = []
        for index in range(args.repeat):
            for key, threads, name in (("raw_loop", 1, "raw HTTP read, a plain loop (1 thread)"),
                                       ("raw", RAW_THREADS, f"raw HTTP read ({RAW_THREADS} threads)")):
                say(f"[{index + 1}/{args.repeat}] {name}; load average {load_average()}")
                with CpuMeter(cpu_pids) as meter:
                    started = time.perf_counter()
                    pages, size = raw_read(feed_server.url, args.page_size, threads)
                    seconds = time.perf_counter() - started
                figures[key].append(Figure(name, events, seconds, meter.result))
                say(f"  {pages} pages, {size / 1e6:.1f} MB in {seconds:.2f} s: {events / seconds:,.0f} events/s")

            say(f"[{index + 1}/{args.repeat}] dlt; load average {load_average()}")
            dlt_work = work / f"dlt-{index}"
            with CpuMeter(cpu_pids) as meter:
                figure, dlt_notes = run_dlt(feed_server.url, args.page_size, dlt_work, args.dlt_parser, events)
            figure.cpu = meter.result
            figures["dlt"].append(figure)
            notes = dlt_notes
            say(f"  {figure.seconds:.2f} s: {figure.rate:,.0f} events/s")

            setup = prepare_dagster(work, feed_server.url, args.page_size, args.writer, spark_port, index,
                                    not args.no_profile, args.pycache, load_settings)
            if args.writer == "spark" and args.warm_partitions and index == 0:
                say(f"warming the Spark server: {args.warm_partitions} partitions into another table (untimed)")
                say(f"  {warm_up(setup, args.warm_partitions):.1f} s")
            if args.launch == "launcher":
                say(f"fork server of {type(setup.instance.run_launcher).__name__} started and warm (untimed): "
                    f"{start_fork_server(setup, setup.work / 'run.log'):.1f} s")
            say(f"[{index + 1}/{args.repeat}] Dagster ({args.launch}); load average {load_average()}")
            run = run_dagster(setup, args.launch, events, cpu_pids)
            if spark_server is None and stop_stray_spark_server(spark_port):
                raise RuntimeError(f"writer deltalake, yet the Dagster run started a Spark server on port "
                                   f"{spark_port} (stopped); see {run.log_path}")
            runs.append(run)
            figures["dagster"].append(run.figure)
            breakdowns.append(dagster_breakdown(setup, run))
            say(f"  {run.figure.seconds:.2f} s: {run.figure.rate:,.0f} events/s; verified: {events} rows, one "
                f"materialization with a cursor per partition")
            # the same schedule tick and run again, with nothing new: what a run costs besides its load
            idle = run_dagster(setup, args.launch, events, cpu_pids, verify=False)
            idle_seconds.append(idle.figure.seconds)
            idle_breakdown = dagster_breakdown(setup, idle)
            say(f"  the same scheduled sync with nothing new: {idle.figure.seconds:.2f} s")
            setup.instance.dispose()
    finally:
        feed_server.stop()
        if spark_server is not None and spark_server.owned:
            spark_server.stop()
        elif spark_port is not None:
            stop_stray_spark_server(spark_port)  # a failed run may have started one
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    def median(values: list[float]) -> float:
        return sorted(values)[(len(values) - 1) // 2]  # the lower median: a measured value

    print()
    print(f"{args.partitions} partitions x {args.events_per_partition} events = {events} events, page size "
          f"{args.page_size}; {os.cpu_count()} cores, load average {load_average()}"
          + (f"; median of {args.repeat} repetitions" if args.repeat > 1 else ""))
    print(f"{'':<66} {'seconds':>8} {'events/s':>10}")
    for name in figures:
        runs_of = figures[name]
        chosen = sorted(runs_of, key=lambda f: f.rate)[(len(runs_of) - 1) // 2]
        all_rates = "" if len(runs_of) == 1 else "   (" + ", ".join(f"{f.rate:,.0f}" for f in runs_of) + ")"
        print(f"{chosen.name:<66} {chosen.seconds:8.2f} {chosen.rate:10,.0f}{all_rates}")
    # ratios within each repetition (same machine load), then their median; a target of None: reported only
    met = True
    for label, other, target in (("Dagster / dlt", "dlt", DLT_RATIO_TARGET),
                                 ("Dagster / raw (a plain loop: the issue's baseline)", "raw_loop", RAW_RATIO_TARGET),
                                 (f"Dagster / raw ({RAW_THREADS} threads: stricter, no target)", "raw", None)):
        ratios = [d.rate / o.rate for d, o in zip(figures["dagster"], figures[other])]
        value = median(ratios)
        verdict = "" if target is None else f"   target >= {target:.2f}: {'met' if value >= target else 'MISSED'}"
        met = met and (target is None or value >= target)
        each = "" if len(ratios) == 1 else "   (" + ", ".join(f"{r:.3f}" for r in ratios) + ")"
        print(f"{label:<66} {value:8.3f}{verdict}{each}")
    # A run's fixed cost bounds Dagster/raw whatever the load's speed: were the load exactly as fast as
    # the parallel raw read, the run would take fixed + raw seconds. (Not a bound against the plain loop,
    # which the load's parallel readers outrun.)
    ceilings = [r.seconds / (idle + r.seconds) for r, idle in zip(figures["raw"], idle_seconds)]
    print(f"{'the same scheduled sync with nothing new (a run without its load)':<66} {median(idle_seconds):8.2f}"
          + ("" if len(idle_seconds) == 1 else "   (" + ", ".join(f"{s:.2f}" for s in idle_seconds) + ")"))
    print(f"{f'Dagster / raw ({RAW_THREADS} threads) ceiling: raw s / (that + raw s)':<66} {median(ceilings):8.3f}"
          + ("" if len(ceilings) == 1 else "   (" + ", ".join(f"{c:.3f}" for c in ceilings) + ")"))
    print(f"command: {command_line}")
    launched = {"cli": shlex.join(runs[-1].command), "api": "dagster api execute_run <ExecuteRunArgs of the run>",
                "inprocess": "python -c <execute_in_process>", "launcher": runs[-1].command[0]}[args.launch]
    print(f"Dagster launch: {launched}"
          + (f"; bytecode cache {args.pycache}" if args.pycache else "; bytecode as the environment has it"
             + (" (PYTHONDONTWRITEBYTECODE=1: no cache)" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "")))
    changes = [f"{name} {value}" for name, value in (
        ("writer", args.writer if args.writer != "deltalake" else ""),
        ("Spark server conf", " ".join(args.spark_conf)), ("load", " ".join(args.load))) if value]
    print("changes from the defaults: " + ("; ".join(changes) if changes else "none"))
    print()
    print("CPU seconds per process during each figure (last repetition):")
    for name in figures:
        figure = figures[name][-1]
        print(f"  {figure.name}: " + ", ".join(f"{k} {v:.1f}" for k, v in figure.cpu.items()))
    print()
    print("\n".join(notes))
    print()
    print("\n".join(breakdowns[-1]))
    print()
    print("The same scheduled sync with nothing new (last repetition):")
    print("\n".join(idle_breakdown))
    return 0 if met else 2


if __name__ == "__main__":
    sys.exit(main())
