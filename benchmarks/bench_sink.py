#!/usr/bin/env python
"""The Delta sink's events/s next to the raw HTTP read rate of the same feed, in one run.

    .venv/bin/python benchmarks/bench_sink.py                          # 1M events, 16 partitions, delta-rs
    .venv/bin/python benchmarks/bench_sink.py --events 100000          # quick
    .venv/bin/python benchmarks/bench_sink.py --writer spark           # Spark writes (embedded Connect server)

Steps (see benchmarks/README.md for what the figures mean):

1. the bundled demo feed server runs in a separate process (`feedapi-dagster demo-server
   --dialect published`), so it never competes for this process's GIL;
2. raw baselines: one `requests.Session`, every page from `_first`; each body is only searched for
   its last cursor (`rfind`) to request the next page, until every partition is caught up. Two of
   them: **a plain loop** (one thread, partition after partition: the issue's "plain loop that
   downloads every page and only looks for the last cursor"), against which the 0.60 target is
   judged, and a stricter one, one thread per partition (at most `--fetch-workers` concurrently, the
   loader's default 8), whose ratio is printed next to it;
3. sink: `FeedLoader(FeedClient(...), DeltaSink(path, engine=...)).sync()` into a fresh Delta table,
   with the engine of `--writer` (the feeds file's `writer:`): `deltalake` (default), i.e.
   `DeltaRsEngine`: delta-rs writes in this process and no Spark session or JVM is started at all;
   or `spark`, i.e. `SparkEngine`: a Spark session (embedded Spark Connect server on a free port or
   `--port`, or `--spark local`) writes. The row count is checked afterwards with delta-rs (untimed,
   either writer). `--sink-repeats` loads in all (each into a fresh table, checked the same way;
   the first one is the one whose CPU and steps are printed), and the ratio is the median sink
   pass's rate over the median raw pass's: one pass of either is noisy on a shared machine. Then
   the fixed cost of a load: a sync with nothing new, and a sync of
   `--partitions` appended events (`POST /admin/append`), each with the same sink and with a fresh
   one (what a new Dagster run pays);
4. one table of figures, the command line, where the wall time of the sink's steps and the CPU
   (per thread group and process: this one, the JVM if any, the feed server) went.

Everything started here is stopped at the end (the feed server; the Spark server if started here).
"""
from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import faulthandler
import functools
import json
import logging
import os
import platform
import pstats
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import requests

import jfr_summary
from feedapi_dagster.lakehouse.spark import find_free_port
from procstat import proc_cpu

WRITERS = ("deltalake", "spark")  # the feeds file's `writer:`
RATIO_TARGET = 0.60
log = logging.getLogger("bench_sink")


# ----------------------------------------------------------------------------- small helpers
def find_jvm_pid(mode: str, port: int) -> int | None:
    """The JVM doing the Spark work: the Connect server listening on `port`, or (local mode) our
    java child process."""
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if not cmdline or not cmdline[0].endswith(b"java"):
            continue
        if mode == "embedded":
            if (b"org.apache.spark.sql.connect.service.SparkConnectServer" in cmdline
                    and f"spark.connect.grpc.binding.port={port}".encode() in cmdline):
                return int(entry.name)
        elif stat[1] == me:
            return int(entry.name)
    return None


def jvm_flags(pid: int | None) -> str:
    """The JIT level and heap cap the JVM runs with (the last flag of each kind wins)."""
    if pid is None:
        return "JVM ?"
    try:
        args = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    except OSError:
        return "JVM ?"
    tier = [a.split("=", 1)[1] for a in args if a.startswith("-XX:TieredStopAtLevel=")]
    xmx = [a[4:] for a in args if a.startswith("-Xmx")]
    jit = {"1": "C1 only"}.get(tier[-1], f"TieredStopAtLevel={tier[-1]} (C2)") if tier else "default JIT (C2)"
    excluded = [a.split("=", 1)[1] for a in args if a.startswith("spark.sql.optimizer.excludedRules=")]
    rules = ", excluded rules: " + ",".join(r.rsplit(".", 1)[-1] for r in excluded[-1].split(",")) if excluded else ""
    return f"JVM {jit}, heap {xmx[-1] if xmx else 'default'}{rules}"


def code_version() -> str:
    """The commit of the checkout the package is imported from (and whether it has local changes)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "feedapi_dagster"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return f"{head or '?'}{' + local changes in feedapi_dagster/' if dirty else ''}"


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores{f' ({model})' if model else ''}, {platform.system()} {platform.release()}"


def rate(events: int, seconds: float) -> float:
    return events / seconds if seconds > 0 else float("nan")


# ----------------------------------------------------------------------------- the feed server
class FeedServerProcess:
    """`feedapi-dagster demo-server --dialect published` in its own process."""

    def __init__(self, events: int, partitions: int, port: int, log_dir: Path):
        self.events, self.partitions, self.port = events, partitions, port
        self.url = f"http://127.0.0.1:{port}/feed"
        self.log_path = log_dir / "demo-server.log"
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def executable() -> str:
        candidate = Path(sys.executable).parent / "feedapi-dagster"
        return str(candidate) if candidate.exists() else (shutil.which("feedapi-dagster") or "feedapi-dagster")

    def command(self) -> list[str]:
        return [self.executable(), "demo-server", "--port", str(self.port), "--dialect", "published",
                "--partitions", str(self.partitions), "--events", str(self.events)]

    def start(self, timeout: float = 900.0) -> float:
        """Start and wait until discovery answers; returns the seconds that took."""
        started = time.perf_counter()
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log_file,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        with requests.Session() as session:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"demo server exited with code {self.proc.returncode}: "
                                       f"{self.log_path.read_text(errors='replace')[-2000:]}")
                try:
                    if session.get(self.url, timeout=2).status_code == 200:
                        return time.perf_counter() - started
                except requests.RequestException:
                    pass
                time.sleep(0.2)
        raise RuntimeError(f"demo server not answering on {self.url} after {timeout:.0f} s")

    def append(self, count: int) -> int:
        response = requests.post(self.url.rsplit("/", 1)[0] + "/admin/append", json={"count": count}, timeout=60)
        response.raise_for_status()
        return int(response.json()["appended"])

    def cpu(self) -> float | None:
        return proc_cpu(self.proc.pid if self.proc else None)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


# ----------------------------------------------------------------------------- CPU accounting
@dataclass
class CpuSample:
    wall: float
    process: float  # this benchmark process, all threads
    main: float  # this thread
    jvm: float | None
    feed: float | None
    children: float  # reader processes that ended (joined) so far

    @classmethod
    def take(cls, jvm_pid: int | None, feed: FeedServerProcess) -> "CpuSample":
        times = os.times()
        return cls(time.perf_counter(), time.process_time(), time.thread_time(), proc_cpu(jvm_pid), feed.cpu(),
                   times.children_user + times.children_system)


@dataclass
class CpuUse:
    """CPU seconds spent during one timed phase, by who spent them."""

    wall: float
    main: float
    workers: float  # reader threads (per call with thread_time) and reader processes (os.times children)
    other: float  # the rest of this process (gRPC/Arrow threads of the Spark Connect client, GC ...)
    jvm: float | None
    feed: float | None

    @classmethod
    def between(cls, a: CpuSample, b: CpuSample, workers: float) -> "CpuUse":
        main = b.main - a.main
        children = b.children - a.children
        return cls(b.wall - a.wall, main, workers + children, max(0.0, (b.process - a.process) - main - workers),
                   None if a.jvm is None or b.jvm is None else b.jvm - a.jvm,
                   None if a.feed is None or b.feed is None else b.feed - a.feed)


class WorkerCpu:
    """Sums `time.thread_time()` of worker calls (each call runs entirely in one worker thread)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._lock = threading.Lock()

    def wrap(self, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.thread_time() - start
                with self._lock:
                    self.seconds += spent
        return timed


# ----------------------------------------------------------------------------- raw baseline
@dataclass
class RawResult:
    seconds: float
    pages: int
    body_bytes: int
    cursors: dict[int, str]
    cpu: CpuUse | None = None
    all_seconds: list[float] = field(default_factory=list)


def raw_read(url: str, page_size: int, workers: int, cpu: WorkerCpu) -> RawResult:
    """Every page of every partition from `_first`; only the last cursor of each body is parsed."""
    session = requests.Session()
    started = time.perf_counter()
    discovery = session.get(url, timeout=60).json()
    token = discovery["token"]
    partition_ids = [int(p["id"]) for p in discovery["partitions"]]
    events_url = url.rstrip("/") + "/events"
    lock = threading.Lock()
    totals = {"pages": 0, "bytes": 0}
    cursors: dict[int, str] = {}

    @cpu.wrap
    def read_partition(partition_id: int) -> None:
        cursor, pages, size = "_first", 0, 0
        params = {"token": token, "partition": str(partition_id), "cursor": cursor, "pagesizehint": str(page_size)}
        while True:
            params["cursor"] = cursor
            response = session.get(events_url, params=params, timeout=(10, 60))
            response.raise_for_status()
            body = response.content
            pages += 1
            size += len(body)
            start = body.rfind(b'{"cursor"')
            if start < 0:
                raise RuntimeError(f"partition {partition_id}: a body without a cursor")
            end = body.find(b"\n", start)
            last = json.loads(body[start:] if end < 0 else body[start:end])["cursor"]
            if last == cursor:  # caught up
                break
            cursor = last
        with lock:
            totals["pages"] += pages
            totals["bytes"] += size
            cursors[partition_id] = cursor

    with ThreadPoolExecutor(min(workers, len(partition_ids)) or 1, thread_name_prefix="raw-read") as pool:
        for future in [pool.submit(read_partition, pid) for pid in partition_ids]:
            future.result()
    seconds = time.perf_counter() - started
    session.close()
    return RawResult(seconds, totals["pages"], totals["bytes"], cursors)


# ----------------------------------------------------------------------------- sink phases
# labels of the timed steps (also the keys of "phases" in the JSON output)
ADD_PAGE = "loader._add_group (per group of rows)"
TO_ARROW = "EventBatch.to_arrow (reader threads, summed)"
FLUSH = "loader._flush (whole commit step)"
WRITE = "engine.write (Delta commit)"
LANDED = "sink._landed (history read after commit)"
READ_HISTORY = "state.read_history (table history)"
ENSURE_TABLE = "engine.ensure_table (create if missing)"


class Phases:
    """Wall time of the sink's steps, by wrapping them in this process only (a few calls per commit,
    plus `_add_pages` once per group of pages: ~1 µs each)."""

    def __init__(self) -> None:
        self.totals: dict[str, list[float]] = {}
        self._undo: list[tuple[object, str, object]] = []

    def reset(self) -> None:
        self.totals = {}

    def wrap(self, owner: object, name: str, label: str) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        totals = self

        @functools.wraps(original)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                entry = totals.totals.setdefault(label, [0, 0.0])
                entry[0] += 1
                entry[1] += time.perf_counter() - start

        setattr(owner, name, timed)
        self._undo.append((owner, name, original))

    def install(self, engine: type) -> None:
        """Wrap the loader's and the sink's steps, and `write`/`ensure_table` of the engine class in
        use (`DeltaRsEngine` or `SparkEngine`)."""
        from feedapi_dagster.lakehouse import loader, sink, state, table

        self.wrap(loader.FeedLoader, "_add_group", ADD_PAGE)
        self.wrap(table.EventBatch, "to_arrow", TO_ARROW)
        self.wrap(loader.FeedLoader, "_flush", FLUSH)
        self.wrap(engine, "write", WRITE)
        self.wrap(sink.DeltaSink, "_landed", LANDED)
        # the sink calls it as `state.read_history`; it calls itself once more (counted twice) only
        # when none of the newest RECENT_HISTORY commits carries a state
        self.wrap(state, "read_history", READ_HISTORY)
        self.wrap(engine, "ensure_table", ENSURE_TABLE)

    def calls(self, label: str) -> int:
        return int(self.totals.get(label, [0])[0])

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


class ThreadProfiles:
    """cProfile of the main thread and of every fetch call (cProfile sees one thread per profiler)."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()

    def wrap(self, fn):
        @functools.wraps(fn)
        def profiled(*args, **kwargs):
            profile = cProfile.Profile()
            with self._lock:
                self.profiles.append(profile)
            profile.enable()
            try:
                return fn(*args, **kwargs)
            finally:
                profile.disable()
        return profiled

    def stats(self, main: cProfile.Profile | None) -> pstats.Stats | None:
        profiles = ([main] if main else []) + self.profiles
        if not profiles:
            return None
        stats = pstats.Stats(profiles[0])
        for profile in profiles[1:]:
            stats.add(profile)
        return stats


# ----------------------------------------------------------------------------- the run
@dataclass
class SinkResult:
    session_seconds: float | None = None  # Spark session acquisition (--writer spark only)
    server: str = ""  # the Spark server/session and its JVM (--writer spark only)
    sink_init_seconds: float = 0.0
    sync_seconds: float = 0.0
    events_loaded: int = 0
    commits: int = 0
    rows: int = 0
    cpu: CpuUse | None = None
    phases: dict[str, list[float]] = field(default_factory=dict)
    all_seconds: list[float] = field(default_factory=list)  # DeltaSink() + sync() of every pass
    small: dict[str, tuple[float, int, int]] = field(default_factory=dict)  # name -> (s, events, commits)


def build_parser() -> argparse.ArgumentParser:
    from_doc = __doc__.splitlines()[0]
    parser = argparse.ArgumentParser(description=from_doc)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--page-size", type=int, default=1000, help="page size hint (raw and sink)")
    parser.add_argument("--writer", choices=WRITERS, default="deltalake",
                        help="who writes the table, as the feeds file's `writer:`: deltalake (DeltaRsEngine: "
                             "delta-rs in this process, no Spark at all; the default) or spark (SparkEngine)")
    parser.add_argument("--spark", choices=("embedded", "local"), default=None,
                        help="--writer spark: an embedded Spark Connect server (the default) or a classic "
                             "local[*] session in this process")
    parser.add_argument("--port", type=int, default=None,
                        help="--writer spark: embedded Spark Connect server port: reused if a server listens "
                             "there, else started (and stopped at the end); default: a free port, i.e. always "
                             "a server of this run's own (a shared one, e.g. on 15002, may be stopped by its "
                             "owner mid-run and carries other sessions' state)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="--writer spark: Spark conf for a server/session started here (repeatable)")
    parser.add_argument("--fetch-workers", type=int, default=8,
                        help="concurrent partition readers, raw and loader (LoadSettings default 8)")
    parser.add_argument("--batch-events", type=int, default=None, help="LoadSettings.batch_events")
    parser.add_argument("--read-processes", type=int, default=None, help="LoadSettings.read_processes (0: reader threads in the load process)")
    parser.add_argument("--raw-repeats", type=int, default=3,
                        help="raw read passes (the median counts: one short pass is noisy)")
    parser.add_argument("--sink-repeats", type=int, default=3,
                        help="full loads, each into a fresh table (the median counts; CPU and steps are the "
                             "first load's)")
    parser.add_argument("--feed-port", type=int, default=0, help="demo feed server port (0: a free one)")
    parser.add_argument("--keep", action="store_true", help="keep the lakehouse dir (the Delta table)")
    parser.add_argument("--profile", metavar="FILE",
                        help="cProfile the sink's first sync (main + fetch threads) into FILE and print the top; "
                             "slows Python down, so the figures of such a run are not comparable")
    parser.add_argument("--jfr", metavar="FILE",
                        help="--writer spark: record the JVM during the first sync with Java Flight Recorder "
                             "(jcmd) into FILE and print its CPU by component (benchmarks/jfr_summary.py)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.writer == "spark":
        args.spark = args.spark or "embedded"
        args.port = args.port or find_free_port()
    else:
        spark_only = [flag for flag, given in (("--spark", args.spark), ("--port", args.port is not None),
                                               ("--conf", args.conf), ("--jfr", args.jfr)) if given]
        if spark_only:
            parser.error(f"{', '.join(spark_only)}: only with --writer spark (--writer deltalake starts no "
                         "Spark session and no JVM)")
    return args


def table_count(path: str) -> int:
    """Rows in the Delta table, read with delta-rs (whichever engine wrote it)."""
    from deltalake import DeltaTable

    return DeltaTable(path).to_pyarrow_dataset().count_rows()


def check_load(path: str, sink, loaded: int, expected: int, raw_cursors: dict[int, str]) -> None:
    """A timed load holds every event once and ends where the raw read ended (checked untimed)."""
    rows = table_count(path)
    if rows != expected or loaded != expected:
        raise RuntimeError(f"{path}: expected {expected} rows, the table has {rows} (sync reported {loaded})")
    ends = {pid: p.cursor for pid, p in sink.state.partitions.items()}
    if ends != raw_cursors:
        raise RuntimeError(f"raw read and sink ended on different cursors: {raw_cursors} vs {ends}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM runs the cleanup (feed server, Spark server) like Ctrl-C; SIGUSR1 dumps every thread's stack
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    command_line = shlex.join(sys.orig_argv if argv is None else [sys.executable, __file__, *argv])
    work = Path(tempfile.mkdtemp(prefix="feedapi-bench-"))
    table_path = str(work / "lakehouse" / "events")
    feed = FeedServerProcess(args.events, args.partitions, args.feed_port or find_free_port(), work)
    spark = server = None
    say = functools.partial(print, file=sys.stderr, flush=True)
    results: dict[str, object] = {}
    try:
        say(f"demo feed: {shlex.join(feed.command())}")
        feed_start = feed.start()
        say(f"demo feed ready on {feed.url} after {feed_start:.1f} s")

        # ---- raw baselines: a plain loop (1 thread), then as many readers as the loader
        load_before = os.getloadavg()
        raws: dict[int, RawResult] = {}
        for workers in sorted({1, args.fetch_workers}):
            passes: list[RawResult] = []
            for _ in range(max(1, args.raw_repeats)):
                raw_cpu = WorkerCpu()
                before = CpuSample.take(None, feed)
                one = raw_read(feed.url, args.page_size, workers, raw_cpu)
                one.cpu = CpuUse.between(before, CpuSample.take(None, feed), raw_cpu.seconds)
                passes.append(one)
                say(f"raw, {workers} thread(s): {args.events} events in {one.seconds:.2f} s = "
                    f"{rate(args.events, one.seconds):,.0f} events/s ({one.pages} pages, {one.body_bytes / 2**20:.0f} MiB)")
            raws[workers] = sorted(passes, key=lambda r: r.seconds)[len(passes) // 2]
            raws[workers].all_seconds = [r.seconds for r in passes]
        loop, raw = raws[1], raws[args.fetch_workers]

        # ---- the engine (a Spark session only for --writer spark)
        from feedapi_dagster.lakehouse.engines import DeltaRsEngine, SparkEngine
        from feedapi_dagster.lakehouse.loader import FeedLoader, LoadSettings
        from feedapi_dagster.lakehouse.readers import PartitionReader
        from feedapi_dagster.lakehouse.sink import DeltaSink
        from feedapi_dagster.protocol import FeedClient

        jvm_pid = None
        sink_result = SinkResult()
        if args.writer == "spark":
            from feedapi_dagster.lakehouse import spark as spark_mod

            settings = spark_mod.SparkSettings(mode=args.spark, port=args.port,
                                               conf=dict(item.split("=", 1) for item in args.conf))
            reused = args.spark == "embedded" and spark_mod.port_open(args.port)
            say(f"spark: {'reusing the server on' if reused else 'starting'} "
                f"{'sc://127.0.0.1:%d' % args.port if args.spark == 'embedded' else 'a local[*] session'} ...")
            started = time.perf_counter()
            spark = spark_mod.spark_session(settings)
            sink_result.session_seconds = time.perf_counter() - started
            if args.spark == "embedded":
                server = spark_mod.ensure_embedded_server(args.port)  # the handle (no new start)
                sink_result.server = f"reused sc://127.0.0.1:{args.port}" if not server.owned else \
                    f"started sc://127.0.0.1:{args.port}"
            else:
                sink_result.server = "local[*] (classic, in-process)"
            jvm_pid = find_jvm_pid(args.spark, args.port)
            sink_result.server += f"; {jvm_flags(jvm_pid)}"
            say(f"spark session in {sink_result.session_seconds:.1f} s ({sink_result.server}, JVM pid {jvm_pid})")
            engine_class = SparkEngine

            def make_sink(path: str = table_path) -> DeltaSink:
                return DeltaSink(path, engine=SparkEngine(spark, path))
        else:
            engine_class = DeltaRsEngine

            def make_sink(path: str = table_path) -> DeltaSink:
                return DeltaSink(path, engine=DeltaRsEngine(path))

        load_settings = LoadSettings(fetch_workers=args.fetch_workers,
                                     **({"batch_events": args.batch_events} if args.batch_events else {}),
                                     **({"read_processes": args.read_processes} if args.read_processes is not None else {}))
        phases = Phases()
        phases.install(engine_class)
        fetch_cpu = WorkerCpu()
        profiles = ThreadProfiles() if args.profile else None
        # reader threads of this process (read_processes 0); reader processes are counted as children
        original_fetch = PartitionReader.run
        wrapped = fetch_cpu.wrap(original_fetch)
        PartitionReader.run = profiles.wrap(wrapped) if profiles else wrapped
        main_profile = cProfile.Profile() if profiles else None
        try:
            # ---- the full load (timed: DeltaSink() with its engine.ensure_table, then sync)
            if args.jfr:
                if jvm_pid is None:
                    raise RuntimeError("--jfr: the Spark JVM was not found")
                jfr_summary.start(jvm_pid, Path(args.jfr).resolve())
            before = CpuSample.take(jvm_pid, feed)
            if main_profile:
                main_profile.enable()
            t0 = time.perf_counter()
            client = FeedClient(feed.url, page_size_hint=args.page_size)
            sink = make_sink()
            t1 = time.perf_counter()
            loader = FeedLoader(client, sink, load_settings)
            reports = loader.sync()
            t2 = time.perf_counter()
            if main_profile:
                main_profile.disable()
            sink_result.cpu = CpuUse.between(before, CpuSample.take(jvm_pid, feed), fetch_cpu.seconds)
            if args.jfr:
                jfr_summary.stop(jvm_pid)
            sink_result.sink_init_seconds, sink_result.sync_seconds = t1 - t0, t2 - t1
            sink_result.events_loaded = sum(r.events for r in reports.values())
            sink_result.commits = phases.calls(WRITE)
            sink_result.phases = phases.totals
            failed = {pid: r.error for pid, r in reports.items() if r.status == "failed"}
            if failed:
                raise RuntimeError(f"sync failed for partitions {failed}")
            total = t2 - t0
            say(f"sink ({args.writer}): {sink_result.events_loaded} events in {total:.2f} s = "
                f"{rate(args.events, total):,.0f} events/s ({sink_result.commits} commits)")

            # ---- checks (untimed)
            sink_result.rows = table_count(table_path)
            check_load(table_path, sink, sink_result.events_loaded, args.events, raw.cursors)
            sink_result.all_seconds.append(total)

            # ---- more full loads, each into a fresh table (timed the same way; no CPU or steps)
            phases.reset()  # the 1st load's steps stay in sink_result.phases
            for index in range(1, max(1, args.sink_repeats)):
                path = f"{table_path}-{index}"
                start = time.perf_counter()
                again = make_sink(path)
                loaded = sum(r.events for r in FeedLoader(FeedClient(feed.url, page_size_hint=args.page_size),
                                                          again, load_settings).sync().values())
                seconds = time.perf_counter() - start
                say(f"sink ({args.writer}), load {index + 1}: {loaded} events in {seconds:.2f} s = "
                    f"{rate(args.events, seconds):,.0f} events/s")
                check_load(path, again, loaded, args.events, raw.cursors)
                sink_result.all_seconds.append(seconds)
                shutil.rmtree(path, ignore_errors=True)

            # ---- fixed cost of a load
            def timed_sync(name: str, fresh: bool, append: int) -> None:
                nonlocal sink, loader
                if append:
                    feed.append(append)
                phases.reset()
                start = time.perf_counter()
                if fresh:
                    sink = make_sink()
                    loader = FeedLoader(FeedClient(feed.url, page_size_hint=args.page_size), sink, load_settings)
                result = loader.sync()
                seconds = time.perf_counter() - start
                sink_result.small[name] = (seconds, sum(r.events for r in result.values()), phases.calls(WRITE))

            timed_sync("empty sync (same sink)", fresh=False, append=0)
            timed_sync("empty sync (fresh sink: a new run)", fresh=True, append=0)
            timed_sync(f"tiny sync, +{args.partitions} events (same sink)", fresh=False, append=args.partitions)
            timed_sync(f"tiny sync, +{args.partitions} events (fresh sink)", fresh=True, append=args.partitions)
            rows_after = table_count(table_path)
            if rows_after != args.events + 2 * args.partitions:
                raise RuntimeError(f"expected {args.events + 2 * args.partitions} rows after the tiny syncs, "
                                   f"found {rows_after}")
        finally:
            PartitionReader.run = original_fetch
            phases.uninstall()

        results = report(args, command_line, feed_start, loop, raw, sink_result, (load_before, os.getloadavg()))
        if profiles:
            stats = profiles.stats(main_profile)
            if stats:
                stats.dump_stats(args.profile)
                print(f"\ncProfile of the first sync (main + fetch threads; cumulative over threads) -> {args.profile}")
                stats.sort_stats("tottime").print_stats(25)
        if args.jfr:
            print()
            print(jfr_summary.report(Path(args.jfr).resolve(), sink_result.cpu.jvm if sink_result.cpu else None,
                                     jfr_summary.jfr_tool(jvm_pid)))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    finally:
        feed.stop()
        if spark is not None:
            try:
                spark.stop()
            except Exception:  # noqa: BLE001 - best effort
                pass
        if server is not None and server.owned:
            server.stop()
        if args.keep:
            print(f"kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if results.get("ratio", 0) >= RATIO_TARGET else 2


def report(args: argparse.Namespace, command_line: str, feed_start: float, loop: RawResult, raw: RawResult,
           sink: SinkResult, load: tuple[tuple[float, ...], tuple[float, ...]]) -> dict[str, object]:
    """`loop`: the plain-loop raw read (the target's baseline); `raw`: the stricter parallel one."""
    n = args.events
    loop_rate, raw_rate = rate(n, loop.seconds), rate(n, raw.seconds)
    sink_seconds = sorted(sink.all_seconds)[len(sink.all_seconds) // 2]
    sink_rate = rate(n, sink_seconds)
    ratio, strict_ratio = sink_rate / loop_rate, sink_rate / raw_rate

    def raw_row(result: RawResult, what: str) -> tuple[str, str]:
        return (f"raw HTTP read, {what} (median pass)",
                f"{rate(n, result.seconds):>12,.0f} events/s   ({result.seconds:.2f} s, {result.pages} requests, "
                f"{result.body_bytes / 2**20:.0f} MiB; passes: " + ", ".join(f"{s:.2f}" for s in result.all_seconds)
                + " s)")

    rows: list[tuple[str, str]] = [
        raw_row(loop, "a plain loop"),
        raw_row(raw, f"{args.fetch_workers} threads"),
        (f"sink ({args.writer}): DeltaSink() + sync() (median load)",
         f"{sink_rate:>12,.0f} events/s   ({sink_seconds:.2f} s; loads: "
         + ", ".join(f"{s:.2f}" for s in sink.all_seconds) + " s)"),
        ("  1st load: DeltaSink() (engine.ensure_table)", f"{sink.sink_init_seconds:>12.2f} s"),
        ("  1st load: sync()", f"{rate(n, sink.sync_seconds):>12,.0f} events/s   ({sink.sync_seconds:.2f} s, "
                               f"{sink.commits} commits)"),
        ("ratio sink / raw, a plain loop (medians)", f"{ratio:>12.2f}      (target >= {RATIO_TARGET:.2f}: "
                                                    f"{'met' if ratio >= RATIO_TARGET else 'NOT met'})"),
        (f"ratio sink / raw, {args.fetch_workers} threads (medians)",
         f"{strict_ratio:>12.2f}      (stricter than the issue's baseline: "
         f"{'also' if strict_ratio >= RATIO_TARGET else 'not'} >= {RATIO_TARGET:.2f})"),
        ("Spark session acquisition",
         f"{'n/a':>12}     (--writer deltalake: no Spark session, no JVM)" if sink.session_seconds is None
         else f"{sink.session_seconds:>12.2f} s   ({sink.server})"),
    ]
    for name, (seconds, events, commits) in sink.small.items():
        rows.append((name, f"{seconds:>12.3f} s   ({events} events, {commits} commit{'s' * (commits != 1)})"))
    rows.append(("rows in the table (checked)", f"{sink.rows:>12,}"))
    width = max(len(k) for k, _ in rows)
    print()
    print(f"bench_sink  {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}  |  {machine()}  |  code {code_version()}")
    print(f"feed: {n:,} events, {args.partitions} partitions, page size {args.page_size}, "
          f"{args.fetch_workers} readers; demo server (own process) ready in {feed_start:.1f} s")
    if args.writer == "spark":
        print(f"writer: spark (SparkEngine: the Spark session writes; {args.spark}: {sink.server})")
    else:
        print("writer: deltalake (DeltaRsEngine: delta-rs writes in this process; no Spark session, no JVM)")
    if args.conf:
        print(f"Spark conf: {', '.join(args.conf)}")
    if args.batch_events or args.read_processes is not None:
        print(f"LoadSettings: batch_events={args.batch_events or 'default'}, read_processes={'default' if args.read_processes is None else args.read_processes}")
    print(f"load average (1 min) before / after: {load[0][0]:.2f} / {load[1][0]:.2f}"
          "  (anything else running on the machine skews every figure)")
    print("-" * (width + 60))
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print("-" * (width + 60))

    def cpu_line(label: str, use: CpuUse | None) -> str:
        if use is None:
            return f"{label:<6} n/a"
        parts = [f"main {use.main:6.2f}", f"workers {use.workers:6.2f}", f"other {use.other:6.2f}",
                 f"JVM {'   n/a' if use.jvm is None else f'{use.jvm:6.2f}'}",
                 f"feed server {'n/a' if use.feed is None else f'{use.feed:6.2f}'}"]
        busy = use.main + use.workers + use.other + (use.jvm or 0) + (use.feed or 0)
        cores = os.cpu_count() or 1
        return (f"{label:<6} wall {use.wall:6.2f} | " + " | ".join(parts)
                + f" | total {busy:6.2f} = {busy / (use.wall * cores):.0%} of {cores} cores")

    print("CPU seconds, median raw passes and 1st load (this process: main thread, reader/fetch threads, other threads; JVM; feed server):")
    print("  " + cpu_line("loop", loop.cpu))
    print("  " + cpu_line("raw", raw.cpu))
    print("  " + cpu_line("sink", sink.cpu))
    if sink.phases:
        print("sink steps (wall seconds, first sync; main thread unless noted):")
        for label, (calls, seconds) in sorted(sink.phases.items(), key=lambda kv: -kv[1][1]):
            print(f"  {label:<52} {seconds:8.2f} s  ({int(calls)} calls)")
        def spent(label: str) -> float:
            return sink.phases.get(label, [0, 0.0])[1]

        first_read = spent(READ_HISTORY) - spent(LANDED)  # the state read before fetching
        waiting = sink.sync_seconds - spent(FLUSH) - spent(ADD_PAGE) - first_read
        print(f"  {'main thread waiting for pages (not overlapped)':<52} {waiting:8.2f} s"
              f"  (sync - flush - add_page - {first_read:.2f} s initial state read)")
    print(f"command: {command_line}")
    print(f"cwd:     {os.getcwd()}")
    return {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "code": code_version(),
        "machine": machine(),
        "command": command_line,
        "writer": args.writer, "spark": args.spark, "conf": args.conf,
        "events": n, "partitions": args.partitions, "page_size": args.page_size,
        "loop_events_per_s": loop_rate, "loop_seconds": loop.seconds, "loop_passes": loop.all_seconds,
        "raw_events_per_s": raw_rate, "raw_seconds": raw.seconds, "raw_passes": raw.all_seconds,
        "load_average": [load[0][0], load[1][0]],
        "sink_events_per_s": sink_rate, "sink_seconds": sink_seconds, "sink_passes": sink.all_seconds,
        "sink_init_seconds": sink.sink_init_seconds, "sync_seconds": sink.sync_seconds,
        "ratio": ratio, "strict_ratio": strict_ratio, "session_seconds": sink.session_seconds, "server": sink.server or None,
        "small_syncs": {k: {"seconds": s, "events": e, "commits": c} for k, (s, e, c) in sink.small.items()},
        "phases": {k: {"calls": int(c), "seconds": s} for k, (c, s) in sink.phases.items()},
        "cpu": {name: use.__dict__ for name, use in (("loop", loop.cpu), ("raw", raw.cpu), ("sink", sink.cpu)) if use},
    }


if __name__ == "__main__":
    sys.exit(main())
