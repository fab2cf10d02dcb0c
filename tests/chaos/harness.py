"""The chaos suite: a seeded random sequence of publisher actions, Dagster runs (in their own
processes, some SIGKILLed) and wire faults, with the exactly-once invariant checked after every step
against the demo server's own log, read back with an independent Delta reader (`deltalake`). The
feed is a FeedAPI feed (published dialect), or a Nakadi event type (`protocol="nakadi"`: appends with
Nakadi's repeated events and repartitionings; its partitions never close, split or change tokens)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
from dagster._core.instance.ref import InstanceRef
from deltalake import DeltaTable

import feedapi_dagster.demo
from feedapi_dagster.demo import DemoFeed, DemoFeedServer, Faults, NakadiDemoServer, NakadiEventType
from feedapi_dagster.lakehouse.cursor_record import decode
from feedapi_dagster.lakehouse.delta_log import FILE_MAINTENANCE, numbered_history
from feedapi_dagster.lakehouse.load_settings import LoadSettings
from feedapi_dagster.lakehouse.maintenance import MaintenanceSettings
from feedapi_dagster.orchestration import FeedConfig, ProjectConfig, build_feedapi_definitions, feed_bindings
from feedapi_dagster.orchestration.automation import DiscoveryCursor, evaluate_discovery, load_request
from feedapi_dagster.orchestration.run_storage import latest_metadata_by_partition
from feedapi_dagster.orchestration.stalled_loads import hand_out_free_slots
from feedapi_dagster.planning import FeedState, PartitionState
from feedapi_dagster.protocol import FeedClient, RetryPolicy, feed_settings
from feedapi_dagster.spark.embedded import ensure_embedded_server
from feedapi_dagster.spark.settings import SparkSettings
from tests.ports import find_free_port

from ..spark_processes import connect_server_pid, kill, python_workers

ROOT = Path(__file__).resolve().parents[2]
RUN_JOB = Path(__file__).with_name("run_job.py")
INSTANCE_TEMPLATE = Path(feedapi_dagster.demo.__file__).with_name("dagster.yaml")
# the env var through which run_job.py finds the project (a JSON-dumped ProjectConfig) of its runs
PROJECT_ENV = "CHAOS_PROJECT_JSON"
MAX_PARTITIONS = 10
# Each step is one publisher action, then one consumer action. action: weight
PUBLISHER_ACTIONS = {"append": 5, "close": 1, "split_method1": 1, "split_method2": 1, "rotate_token": 1}
NAKADI_PUBLISHER_ACTIONS = {"append": 5, "repartition": 1}
CONSUMER_ACTIONS = {
    "sensor": 3,
    "schedule": 4,
    "backfill": 1,
    "rebuild": 1,
    "same_partition_twice": 1,
    "maintenance": 1,
}


class InvariantBroken(AssertionError):
    pass


@dataclass
class Tally:
    steps: Counter = field(default_factory=Counter)
    runs: Counter = field(default_factory=Counter)
    kills: Counter = field(default_factory=Counter)
    checks: int = 0
    published: int = 0


class ChaosRun:
    def __init__(
        self,
        seed: int,
        work_dir: Path,
        fault_rate: float = 0.2,
        kill_rate: float = 0.3,
        spark_port: int | None = None,
        protocol: str = "feedapi",
    ):
        self.seed = seed
        self.rng = random.Random(seed)
        self.work_dir = work_dir
        self.fault_rate = fault_rate
        self.kill_rate = kill_rate
        self._run_seconds: list[float] = []  # how long the runs not killed took, start to exit
        # a kill drawn for runs that all ended before it came: the next launch is killed instead, so that
        # the kills a seed draws land whatever this machine's speed
        self._kill_owed = False
        self.tally = Tally()
        self.ancestors: dict[int, list[int]] = {}  # method-2 ancestry seen in discovery (ids are never reused)
        faults = Faults(fault_rate, seed=seed, retry_after=0)
        if protocol == "nakadi":
            self.feed = NakadiEventType(partitions=3, events=300, seed=seed, duplicate_ratio=0.1)
            self.server = NakadiDemoServer(self.feed, faults=faults).start()
            self.feed_settings = {"protocol": "nakadi", "url": self.server.url, "event_type": self.feed.name}
            self.publisher_actions = NAKADI_PUBLISHER_ACTIONS
        else:
            at_least_once = seed % 2 == 1
            self.feed = DemoFeed(
                partitions=3,
                events=300,
                seed=seed,
                exactly_once=not at_least_once,
                duplicate_ratio=0.1 if at_least_once else 0.0,
            )
            self.server = DemoFeedServer(self.feed, dialect="published", faults=faults).start()
            self.feed_settings = {"url": self.server.url}
            self.publisher_actions = PUBLISHER_ACTIONS
        self.spark = ensure_embedded_server(spark_port or find_free_port(), work_dir=work_dir / "spark")
        home = work_dir / "dagster_home"
        home.mkdir(parents=True, exist_ok=True)
        shutil.copy(INSTANCE_TEMPLATE, home / "dagster.yaml")
        self.config = ProjectConfig(
            lakehouse=str(work_dir / "lakehouse"),
            spark=SparkSettings(mode="embedded", port=self.spark.port),
            feeds=[
                FeedConfig(
                    name="chaos",
                    **self.feed_settings,
                    page_size_hint=50,
                    retry=RetryPolicy(max_attempts=30, base_delay=0.01, max_delay=0.2),
                    load=LoadSettings(max_events_per_partition=150),
                    # OPTIMIZE and VACUUM often, with no time-travel window: only the
                    # loads that may still write keep the files VACUUM would delete
                    maintenance=MaintenanceSettings(
                        optimize_every_commits=3, vacuum_every_commits=4, time_travel_hours=0
                    ),
                )
            ],
        )
        project_path = work_dir / "project.json"
        project_path.write_text(self.config.model_dump_json())
        # the runs' processes rebuild the very same project from this file
        assert ProjectConfig.model_validate_json(project_path.read_text()) == self.config
        self.env = {**os.environ, "DAGSTER_HOME": str(home), PROJECT_ENV: str(project_path)}
        self.env.pop("FEEDAPI_LAKEHOUSE", None)
        self.feed_config = self.config.feeds[0]
        self.table = self.config.table_path(self.feed_config)
        self.instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))
        self.defs = build_feedapi_definitions(self.config)
        self.binding, spec = next(feed_bindings(self.config))
        self.pool = self.defs.get_assets_def(spec.key).op.pool  # one load of the feed at a time
        # the pool exists before the first runs, as after `dagster instance concurrency set`: two runs
        # whose steps both create it on first use (Dagster 1.13, SQLite storage) can leave one of them
        # pending for ever, its slot free (seen when a chaos run's first action started two at once)
        self.instance.event_log_storage.initialize_concurrency_limit_to_default(self.pool)
        self.sensor_cursor: str | None = None
        self.log = (work_dir / "runs.log").open("ab")

    def close(self) -> None:
        self.server.stop()
        self.spark.stop()
        self.instance.dispose()
        self.log.close()

    # ------------------------------------------------------------------ the run
    def run(self, steps: int | None = None, minutes: float | None = None) -> Tally:
        deadline = time.monotonic() + 60 * minutes if minutes else None
        step = 0
        while (steps is None or step < steps) and (deadline is None or time.monotonic() < deadline):
            step += 1
            for actions in (self.publisher_actions, CONSUMER_ACTIONS):
                action = self.rng.choices(list(actions), weights=list(actions.values()))[0]
                getattr(self, f"_{action}")()
                self.tally.steps[action] += 1
            self.check(final=False, where=f"step {step}")
        self.chaos_runs = sum(self.tally.runs.values())
        self.chaos_faults = sum(self.server.fault_counts.values())
        self.catch_up()
        self.check(final=True, where="after catching up")
        return self.tally

    def summary(self) -> str:
        t = self.tally
        kind = (
            "nakadi"
            if isinstance(self.feed, NakadiEventType)
            else "at-least-once"
            if not self.feed.exactly_once
            else "exactly-once"
        )
        published = (
            self.feed.published_count()
            if isinstance(self.feed, NakadiEventType)
            else sum(len(self.feed.published(p)) for p in self._all_partitions())
        )
        return (
            f"chaos seed={self.seed} feed={kind} published_events={published} "
            f"steps={dict(t.steps)} runs={dict(t.runs)} (under chaos: {getattr(self, 'chaos_runs', '?')}) "
            f"kills={dict(t.kills)} maintenance_commits={self._maintenance_commits()} "
            f"faults={dict(self.server.fault_counts)} invariant_checks={t.checks}"
        )

    def _maintenance_commits(self) -> dict[str, int]:
        if self._table_version() is None:
            return {}
        return dict(
            Counter(c["operation"] for c in DeltaTable(self.table).history() if c.get("operation") in FILE_MAINTENANCE)
        )

    # ------------------------------------------------------------------ publisher actions
    def _open(self) -> list[int]:
        return [p.id for p in self._discovery().partitions if not p.closed]

    def _discovery(self):
        return FeedClient(feed_settings(**self.feed_settings)).discover()

    def _append(self) -> None:
        self.feed.append(self.rng.randint(1, 150))

    def _close(self) -> None:
        open_ids = self._open()
        if len(open_ids) > 1:
            self.feed.close(self.rng.choice(open_ids))

    def _split(self, method: int) -> None:
        if len(self._discovery().partitions) >= MAX_PARTITIONS:
            return
        candidates = self._open()
        self.rng.shuffle(candidates)
        for partition in candidates:
            try:
                getattr(self.feed, f"split_method{method}")(partition, children=2)
                self.feed.append(self.rng.randint(1, 60))
                return
            except ValueError:
                continue

    def _split_method1(self) -> None:
        self._split(1)

    def _split_method2(self) -> None:
        self._split(2)

    def _rotate_token(self) -> None:
        self.server.rotate_token()

    def _repartition(self) -> None:
        count = len(self._discovery().partitions)
        if count < MAX_PARTITIONS:
            self.feed.repartition(count + self.rng.randint(1, 2))
            self.feed.append(self.rng.randint(1, 60))

    # ------------------------------------------------------------------ consumer actions
    def _sensor(self) -> None:
        info = self._discovery()
        known = self.instance.get_dynamic_partitions(self.binding.partitions_name)
        result = evaluate_discovery(self.binding, info, DiscoveryCursor.parse(self.sensor_cursor), known)
        self.sensor_cursor = result.cursor
        for request in result.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        for request in result.run_requests:
            self._launch(self._load_spec(request))

    def _schedule(self) -> None:
        schedule = self.defs.resolve_schedule_def("feedapi_chaos_schedule")
        with dg.build_schedule_context(instance=self.instance) as context:
            for request in schedule.evaluate_tick(context).run_requests or []:
                self._launch(self._load_spec(request))

    def _backfill(self) -> None:
        closed = [p.id for p in self._discovery().partitions if p.closed]
        if closed:
            partition = str(self.rng.choice(closed))
            self.instance.add_dynamic_partitions(self.binding.partitions_name, [partition])
            self._launch({"kind": "asset", "partition": partition, "tags": {"dagster/backfill": f"chaos-{partition}"}})

    def _rebuild(self) -> None:
        live = [p.id for p in self._discovery().partitions]
        chosen = self.rng.sample(live, k=min(len(live), self.rng.randint(1, 2)))
        request = self._load_request(chosen, f"chaos-rebuild-{time.time()}", rebuild=chosen)
        self._launch(self._load_spec(request))

    def _same_partition_twice(self) -> None:
        partition = self.rng.choice([p.id for p in self._discovery().partitions])
        request = self._load_request([partition], f"chaos-twice-{time.time()}")
        self._launch(self._load_spec(request), {"kind": "asset", "partition": str(partition), "tags": {}})

    def _maintenance(self) -> None:
        """The maintenance job (OPTIMIZE, VACUUM) launched beside a load of every live partition."""
        live = [p.id for p in self._discovery().partitions]
        request = self._load_request(live, f"chaos-maintenance-{time.time()}")
        self._launch(self._load_spec(request), {"kind": "maintenance"})

    def _load_request(self, partitions: list[int], reason: str, rebuild: list[int] = ()) -> dg.RunRequest:
        """A run of the asset over `partitions` (registered as dynamic partitions first, as the
        sensor would, should discovery have shown them since its last tick)."""
        self.instance.add_dynamic_partitions(self.binding.partitions_name, [str(p) for p in partitions])
        order = self.instance.get_dynamic_partitions(self.binding.partitions_name)
        return load_request(self.binding, partitions, reason, order, rebuild=rebuild)

    @staticmethod
    def _load_spec(request: dg.RunRequest) -> dict:
        return {"kind": "load", "run_config": request.run_config, "tags": request.tags}

    # ------------------------------------------------------------------ runs in their own processes
    def _launch(self, *specs: dict, kill: bool | None = None) -> None:
        self._check_pool()
        version = self._table_version()
        started = time.monotonic()
        processes = [
            subprocess.Popen(
                [sys.executable, str(RUN_JOB), json.dumps(spec)],
                env=self.env,
                cwd=ROOT,
                stdout=self.log,
                stderr=subprocess.STDOUT,
            )
            for spec in specs
        ]
        drawn = self.rng.random() < self.kill_rate if kill is None else kill
        kill = drawn or (kill is None and self._kill_owed)
        codes = []
        if kill:
            how = self.rng.choice(["timer", "after_commit", "python_worker"])
            self.tally.kills[how] += 1
            if how == "python_worker":
                self._kill_python_workers_later(processes)
            else:
                self._kill_owed = not self._kill_later(processes, how, version)
        try:
            for process in processes:
                code = self._wait(process)
                codes.append(code)
                self.tally.runs["killed" if code == -signal.SIGKILL else "succeeded" if code == 0 else "failed"] += 1
        finally:  # a run that timed out does not outlive the chaos run
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        if not kill and codes and all(code == 0 for code in codes):
            self._run_seconds.append(time.monotonic() - started)
        self._fail_dead_runs()

    def _wait(self, process: subprocess.Popen, timeout: float = 600) -> int:
        """The run's exit code; meanwhile, every 5 s, what the feed's stalled-loads sensor does on the
        daemon for a load Dagster left waiting for a free slot (two runs of the feed that start at
        once can leave one so: `hand_out_free_slots`)."""
        deadline = time.monotonic() + timeout
        while (code := process.poll()) is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(process.args, timeout)
            for _ in hand_out_free_slots(self.instance, self.binding, time.time()):
                self.tally.runs["handed a lost slot"] += 1
            # the sensor's interval is a tenth of stalled_load_seconds, at least 5 s; the run's end is
            # seen at once (a plain 5 s sleep cost 2.5 s a run on average)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        return code

    def _kill_later(self, processes: list[subprocess.Popen], how: str, version: int | None) -> bool:
        """Whether a run was still running when the kill came (it was killed)."""
        # a run spends its first seconds importing and connecting; kill anywhere after that, within the
        # few seconds a load of these small feeds takes on a warm server: at most 7 s, and within 90% of
        # what the runs not killed took so far (later draws would miss it)
        upper = min(7.0, 0.9 * statistics.median(self._run_seconds)) if self._run_seconds else 7.0
        deadline = time.monotonic() + (self.rng.uniform(1.5, max(2.0, upper)) if how == "timer" else 120)
        while time.monotonic() < deadline and any(p.poll() is None for p in processes):
            if how == "after_commit" and self._table_version() != version:
                break  # a commit just landed: the run is between its commit and its end
            time.sleep(0.05)
        landed = False
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                landed = True
        return landed

    def _kill_python_workers_later(self, processes: list[subprocess.Popen]) -> None:
        """SIGKILL the Spark server's Python workers while the runs read (their tasks are retried by
        Spark; the run goes on)."""
        deadline = time.monotonic() + self.rng.uniform(1, 10)
        while time.monotonic() < deadline and any(p.poll() is None for p in processes):
            time.sleep(0.05)
        jvm = connect_server_pid(self.spark.port)
        if jvm is not None and any(p.poll() is None for p in processes):
            self.tally.kills["python_worker_pids"] += len(kill(python_workers(jvm), signal.SIGKILL))

    def _fail_dead_runs(self) -> None:
        """What the daemon's run monitoring does for a run whose process died: mark it failed, and,
        if the instance sets `run_monitoring.free_slots_after_run_end_seconds`, free the concurrency
        slots it held (here at once, not that many seconds later)."""
        free_slots = self.instance.run_monitoring_settings.get("free_slots_after_run_end_seconds")
        for run in self.instance.get_runs(
            dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING])
        ):
            self.instance.report_run_failed(run)
            if free_slots:
                self.instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)

    def _check_pool(self) -> None:
        """Every load waits for a slot of the feed's pool: a slot still held by a finished run (its
        process was killed) would keep every later load of the feed waiting forever."""
        info = self.instance.event_log_storage.get_concurrency_info(self.pool)
        holders = info.active_run_ids | info.assigned_run_ids
        finished = (
            sorted(
                run.run_id for run in self.instance.get_runs(dg.RunsFilter(run_ids=list(holders))) if run.is_finished
            )
            if holders
            else []
        )
        if finished:
            raise InvariantBroken(
                f"seed {self.seed}: pool {self.pool} (limit {info.limit}): slots held by finished runs {finished} "
                "(killed); every later load of the feed would wait for them forever"
            )

    def catch_up(self) -> None:
        """No faults, no kills: runs until every live partition holds everything published."""
        self.server.faults = None
        for _ in range(3):
            self._sensor_no_kill()
            # a run of every live partition (drained ones included): what an empty sync used to load
            live = [p.id for p in self._discovery().partitions]
            self._launch(self._load_spec(self._load_request(live, f"chaos-catch-up-{time.time()}")), kill=False)

    def _sensor_no_kill(self) -> None:
        saved, self.kill_rate = self.kill_rate, 0.0
        try:
            self._sensor()
        finally:
            self.kill_rate = saved

    # ------------------------------------------------------------------ the invariant
    def _table_version(self) -> int | None:
        try:
            return DeltaTable(self.table).version()
        except Exception:  # noqa: BLE001 - no table yet
            return None

    def _all_partitions(self) -> list[int]:
        return sorted({p.id for p in self._discovery().partitions} | set(self._state().partitions))

    def _state(self, table: DeltaTable | None = None, rows: dict[int, list[dict]] | None = None) -> FeedState:
        """The state committed as of `table`'s version (a snapshot), else the newest. A load killed
        between its rows commit and its state commit leaves the rows commit's state, whose pending
        partitions resume after their newest rows (`rows`: the snapshot's, by partition, in position
        order; read here when not given)."""
        if table is None:
            if self._table_version() is None:
                return FeedState()
            table = DeltaTable(self.table)
        version = table.version()  # `table`'s snapshot: the rows are read from it, the state is its
        for commit in numbered_history(table, None):
            decoded = decode(commit.get("userMetadata"), commit["version"])
            if decoded is None:
                continue
            state, _, pending = decoded
            if not pending:
                return state
            if rows is None:
                rows = {}
                snapshot = DeltaTable(self.table, version=version)
                for row in snapshot.to_pyarrow_table(columns=["partition_id", "position", "cursor"]).to_pylist():
                    rows.setdefault(row["partition_id"], []).append(row)
                for partition_rows in rows.values():
                    partition_rows.sort(key=lambda r: r["position"])
            resumed = {}
            for pid in pending:
                start = state.get(pid) or PartitionState()
                last = rows.get(pid, [])[-1:]
                if last and last[0]["position"] >= start.position:
                    resumed[pid] = PartitionState(
                        cursor=last[0]["cursor"], position=last[0]["position"] + 1, inherited_from=start.inherited_from
                    )
            return FeedState(generation=state.generation, partitions={**state.partitions, **resumed})
        return FeedState()

    def check(self, final: bool, where: str) -> None:
        self.tally.checks += 1
        if (version := self._table_version()) is None:
            if final:
                raise InvariantBroken(f"seed {self.seed}, {where}: nothing was ever loaded")
            return
        # one version, named, its rows and its state (`numbered_history`): a load may commit while the
        # check reads (seen once: the rows of version 9 checked against version 10's state)
        table = DeltaTable(self.table, version=version)
        rows: dict[int, list[dict]] = {}
        for row in table.to_pyarrow_table(
            columns=["partition_id", "position", "payload", "event_id", "cursor"]
        ).to_pylist():
            rows.setdefault(row["partition_id"], []).append(row)
        for partition_rows in rows.values():
            partition_rows.sort(key=lambda r: r["position"])
        # the state of the very snapshot the rows came from: a killed run's Spark job may still be
        # committing (the server finishes what a client submitted; the commit is whole either way)
        state = self._state(table, rows)
        info = self._discovery()
        live = {p.id: p for p in info.partitions}
        problems = []
        for partition in sorted(set(rows) | set(state.partitions) | (set(live) if final else set())):
            got = [r["payload"] for r in rows.get(partition, [])]
            if [r["position"] for r in rows.get(partition, [])] != list(range(len(got))):
                problems.append(f"partition {partition}: positions are not 0..{len(got) - 1}")
            committed = state.get(partition)
            if committed is not None and committed.position != len(got):
                problems.append(f"partition {partition}: {len(got)} rows but committed position {committed.position}")
            expected = self.feed.expected_events(partition)
            if partition in live and live[partition].cursor_from:
                self.ancestors[partition] = list(live[partition].cursor_from)
            # a method-2 child that was itself split away has vanished from discovery: its ancestry
            # is what discovery said while it was live
            ancestors = self.ancestors.get(partition, [])
            if ancestors:
                inherited = {r["payload"] for a in ancestors for r in rows.get(a, [])}
                expected = [e for e in expected if e not in inherited]
            complete = final and partition in live
            if (got != expected) if complete else (got != expected[: len(got)]):
                problems.append(
                    f"partition {partition}: {len(got)} rows are not {'all' if complete else 'a prefix'} "
                    f"of the {len(expected)} events published for it"
                )
        ids = Counter(r["event_id"] for part in rows.values() for r in part if r["event_id"] is not None)
        repeated = [i for i, n in ids.items() if n > 1]
        if repeated:
            problems.append(f"event ids stored twice: {repeated[:5]}")
        problems += self._method1_order(table, live)
        if final:
            latest = latest_metadata_by_partition(self.instance, self.binding, [str(p) for p in state.partitions])
            for partition, committed in state.partitions.items():
                mirrored = latest.get(str(partition))
                cursor = mirrored.cursor if mirrored else None
                if partition in live and cursor != committed.cursor:
                    problems.append(f"partition {partition}: metadata cursor {cursor!r} != Delta {committed.cursor!r}")
        if problems:
            raise InvariantBroken(f"seed {self.seed}, {where}:\n  " + "\n  ".join(problems))

    def _method1_order(self, table: DeltaTable, live: dict) -> list[str]:
        history = [(c["version"], decode(c.get("userMetadata"), c["version"])) for c in numbered_history(table, None)]
        states = sorted((version, d[0]) for version, d in history if d is not None)
        problems = []
        # (an inferred parent - feedapi-go's omitted startsAfterPartition: 0 - is no real split here)
        for child in (p for p in live.values() if p.starts_after is not None and not p.starts_after_inferred):
            first = next((v for v, s in states if s.get(child.id) and s.get(child.id).position > 0), None)
            drained = next(
                (v for v, s in states if s.get(child.starts_after) and s.get(child.starts_after).drained), None
            )
            if first is not None and (drained is None or drained >= first):
                problems.append(f"partition {child.id} was loaded before its parent {child.starts_after} was drained")
        return problems
