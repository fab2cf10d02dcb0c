"""The embedded Spark server warmed up before a user's first load waits for it.

A new Spark Connect server's first load pays for what the JVM does once: loading Delta's and Spark
SQL's classes, compiling their hot paths (JIT), starting the session's Python workers and importing
the data source in them. That made the first run after a start three times as slow as the next ones
(`benchmarks/README.md`, "Cold as warm"). `warm_up` pays it ahead, with the code a run uses: a
scratch feed of the bundled demo server (in this process, on 127.0.0.1) loaded by `FeedLoader` into
a scratch Delta table in the server's work dir, in each payload form the project's feeds use, then
removed. It joins the server-side session every run joins (`SparkConnectServer.client_url`), whose
Python workers then stay up for the runs.

Who warms: `feedapi-dagster dev` once its server is up, and `dg dev` / `dagster dev` when they load
the definitions (`warm_up_in_background`: the server started and warmed by a process of its own, the
definitions load not held up). A run's session says in the run's log whether its server was warmed,
when and in how long (`WarmUpRecord.describe`), after waiting (bounded) for a warm-up still going.

One warm-up per server at a time: an exclusive lock on `warm-up.lock` in the server's work dir, held
while warming; the record (`warm-up.json` in the server's work dir) names the server's process,
so a record of a server since replaced is not believed.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, get_args

from feedapi_dagster.errors import FeedApiDagsterError
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.lakehouse.load_settings import LoadSettings
from feedapi_dagster.lakehouse.loader import FeedLoader
from feedapi_dagster.lakehouse.payload_form import PayloadForm
from feedapi_dagster.protocol.feedapi.settings import FeedApiSettings
from feedapi_dagster.spark.connect_server import port_open
from feedapi_dagster.spark.embedded import ensure_embedded_server
from feedapi_dagster.spark.server_record import ServerRecord, is_recorded_server, read_record
from feedapi_dagster.spark.sessions import spark_session
from feedapi_dagster.spark.settings import SparkSettings, installation_port

log = logging.getLogger(__name__)

# The scratch feed: enough rows for the JIT to compile the write path's per-row code (C2 compiles a
# method after thousands of calls), few enough to take seconds; its pages as the loads' default.
WARM_UP_PARTITIONS = 4
WARM_UP_EVENTS = 60_000
WARM_UP_PAGE_SIZE = 5_000
# A run waits at most this long for a warm-up still going (its share left to do), then loads anyway.
WAIT_FOR_WARM_UP_SECONDS = 120.0

State = Literal["warming", "warmed", "failed"]


@dataclass(frozen=True)
class WarmUpRecord:
    """What `warm_up` did to the server of `server_pid` (`warm-up.json` in the server's work dir)."""

    server_pid: int
    server_started_at: str  # the server record's: a record of a server since replaced names another
    state: State
    started_at: str  # ISO 8601, UTC
    seconds: float | None = None
    events: int = 0
    forms: tuple[str, ...] = ()
    error: str | None = None

    def describe(self) -> str:
        """One line for a run's log: what was warmed, when, in how long."""
        when = self.started_at[11:19] + " UTC"
        what = (
            f"a scratch load of {self.events:,} events into a scratch Delta table per payload form "
            f"({', '.join(self.forms)}): Delta's and Spark SQL's classes loaded, their write path compiled, "
            "the session's Python workers started"
        )
        if self.state == "warmed":
            return f"the Spark server (pid {self.server_pid}) was warmed up at {when} in {self.seconds:.1f} s: {what}"
        if self.state == "failed":
            return (
                f"the Spark server's warm-up at {when} failed ({self.error}): this run pays for the JVM's first "
                "loads itself"
            )
        return f"the Spark server's warm-up started at {when} is still going: this run shares the machine with it"


class WarmUpFailed(FeedApiDagsterError):
    """The warm-up's scratch load did not finish (its record says why; runs load regardless)."""


def _lock_file(server: ServerRecord) -> Path:
    return Path(server.work_dir) / "warm-up.lock"


def _record_file(server: ServerRecord) -> Path:
    return Path(server.work_dir) / "warm-up.json"


def _write(server: ServerRecord, record: WarmUpRecord) -> None:
    path = _record_file(server)
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps(asdict(record)))
    scratch.replace(path)  # a reader sees the old record or the new one, never half of one


def read_warm_up(port: int) -> WarmUpRecord | None:
    """The warm-up record of the server running on `port`, None when it was never warmed."""
    server = read_record(port)
    if server is None:
        return None
    try:
        fields = json.loads(_record_file(server).read_text())
    except (FileNotFoundError, ValueError):
        return None
    record = WarmUpRecord(**{**fields, "forms": tuple(fields.get("forms", ()))})
    if (record.server_pid, record.server_started_at) != (server.pid, server.started_at):
        return None
    return record


@contextlib.contextmanager
def _warm_up_lock(server: ServerRecord) -> Iterator[bool]:
    """Holds the server's warm-up lock; yields False at once when another process holds it."""
    with open(_lock_file(server), "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def warm_up(
    port: int, forms: Sequence[PayloadForm] = ("json",), *, events: int = WARM_UP_EVENTS
) -> WarmUpRecord | None:
    """Warm the embedded server running on `port` (see the module's docstring); None when another
    process is warming it already. Raises `WarmUpFailed` when the scratch load fails (recorded)."""
    server = read_record(port)
    if server is None or not is_recorded_server(server):
        raise WarmUpFailed(f"no embedded Spark server of this installation runs on port {port}")
    with _warm_up_lock(server) as mine:
        if not mine:
            log.info("the Spark server on port %d is being warmed up by another process", port)
            return None
        forms = tuple(dict.fromkeys(forms))
        began = time.monotonic()
        record = WarmUpRecord(
            server_pid=server.pid,
            server_started_at=server.started_at,
            state="warming",
            started_at=datetime.now(UTC).isoformat(timespec="seconds"),
            events=events,
            forms=forms,
        )
        _write(server, record)
        log.info("warming the Spark server on port %d up: %s", port, record.describe())
        scratch = Path(server.work_dir) / "warm-up" / uuid.uuid4().hex
        try:
            scratch_loads(port, scratch, forms, events)
        except Exception as error:
            failed = replace(record, state="failed", error=str(error).splitlines()[0])
            _write(server, failed)
            raise WarmUpFailed(failed.describe()) from error
        finally:
            shutil.rmtree(scratch.parent, ignore_errors=True)
        done = replace(record, state="warmed", seconds=round(time.monotonic() - began, 1))
        _write(server, done)
        log.info("%s", done.describe())
        return done


def scratch_loads(port: int, scratch: Path, forms: Sequence[PayloadForm], events: int) -> None:
    """A run's load, as a run does it, of a scratch demo feed into one scratch table per form."""
    # imported here: a run's process imports this module for `log_warm_up`, never the demo servers
    from feedapi_dagster.demo.feedapi.demo_feed import DemoFeed
    from feedapi_dagster.demo.feedapi.server import DemoFeedServer

    session = spark_session(SparkSettings(mode="embedded", port=port))
    feed = DemoFeed(partitions=WARM_UP_PARTITIONS, events=events)
    with DemoFeedServer(feed, dialect="published") as server:
        settings = FeedApiSettings(url=server.url, page_size_hint=WARM_UP_PAGE_SIZE)
        for form in forms:
            table = FeedTable(session, str(scratch / form), payload_form=form)
            loader = FeedLoader.into(table, settings, LoadSettings(), run_id=None, logger=log)
            loader.load(range(WARM_UP_PARTITIONS))


def wait_for_warm_up(port: int, timeout: float = WAIT_FOR_WARM_UP_SECONDS) -> WarmUpRecord | None:
    """The record of the server on `port` once no warm-up is going (at most `timeout` s from now)."""
    record = read_warm_up(port)
    server = read_record(port)
    if record is None or record.state != "warming" or server is None:
        return record
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with _warm_up_lock(server) as free:
            if free:
                return _ended(read_warm_up(port))
        time.sleep(0.2)
    return read_warm_up(port)


def _ended(record: WarmUpRecord | None) -> WarmUpRecord | None:
    """`record` once nobody holds the lock: one still "warming" is of a process that died warming."""
    if record is None or record.state != "warming":
        return record
    return replace(record, state="failed", error="its process ended before it finished")


def log_warm_up(port: int, logger: logging.Logger | logging.LoggerAdapter) -> None:
    """Says in a run's log whether the server on `port` was warmed up, when and in how long, after
    waiting (at most `WAIT_FOR_WARM_UP_SECONDS`) for a warm-up still going."""
    record = read_warm_up(port)
    if record is not None and record.state == "warming":
        logger.info(
            "waiting (at most %.0f s) for the Spark server's warm-up, started at %s UTC, to end",
            WAIT_FOR_WARM_UP_SECONDS,
            record.started_at[11:19],
        )
        record = wait_for_warm_up(port)
    if record is None:
        logger.info(
            "the Spark server on port %d was not warmed up: the first loads on it pay for the JVM's class "
            "loading and JIT (`feedapi-dagster warm-up` warms it now; `dg dev`, `dagster dev` and "
            "`feedapi-dagster dev` start and warm a server ahead)",
            port,
        )
    else:
        logger.info("%s", record.describe())


# The processes of `dagster dev` and `dg dev` (their code servers, and the runs they launch): Dagster
# marks them with `DAGSTER_IS_DEV_CLI` (every `dg` command sets it too: `dg check defs`, `dg list
# defs`) and `DAGSTER_verbose` (set only by `dagster dev`'s implementation, which `dg dev` calls), and
# `dg check defs` with `DAGSTER_IS_DEFS_VALIDATION_CLI`. Dagster's own markers, no public API: a
# Dagster upgrade that drops them leaves the server cold, never a JVM started by a `dg` command.
_DAGSTER_DEV = ("DAGSTER_IS_DEV_CLI", "DAGSTER_verbose")
_DEFS_VALIDATION = "DAGSTER_IS_DEFS_VALIDATION_CLI"
_started_in_background: set[int] = set()


def under_dagster_dev() -> bool:
    """Whether this process is one of `dagster dev`'s or `dg dev`'s (not another `dg` command's)."""
    return all(name in os.environ for name in _DAGSTER_DEV) and _DEFS_VALIDATION not in os.environ


def warm_up_under_dagster_dev(settings: SparkSettings, forms: Sequence[PayloadForm]) -> bool:
    """As the definitions load under `dg dev` / `dagster dev`: the embedded server started and warmed
    in the background when none runs on its port yet (a server already running is left alone: a run
    may be using it); whether it was."""
    if settings.mode != "embedded" or not under_dagster_dev() or settings.port in _started_in_background:
        return False
    if not warm_up_in_background(settings.port, settings.conf, forms or ("json",)):
        return False
    _started_in_background.add(settings.port)
    log.info("starting and warming the embedded Spark server on port %d in the background", settings.port)
    return True


# the server's Spark settings for the warm-up's process: in its environment, not on its command line
# (which `ps` shows to every user)
_CONF_ENV = "FEEDAPI_DAGSTER_WARM_UP_CONF"


def warm_up_in_background(port: int, conf: dict[str, str], forms: Sequence[PayloadForm]) -> bool:
    """Start (detached: it stays for the runs) and warm the embedded server on `port` in a process of
    its own (`feedapi-dagster warm-up`), unless something listens there already; whether it did. Its
    output goes to `<tmp>/feedapi-dagster-warm-up-<port>.log`."""
    if port_open(port):
        return False
    command = [sys.executable, "-m", "feedapi_dagster.cli", "warm-up", "--port", str(port), "--forms", ",".join(forms)]
    with open(Path(tempfile.gettempdir()) / f"feedapi-dagster-warm-up-{port}.log", "ab") as out:
        subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # not stopped with the code server that started it, nor by its Ctrl-C
            env={**os.environ, _CONF_ENV: json.dumps(conf)},
        )
    return True


def _warm_up_command(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    forms = [form for form in args.forms.split(",") if form]
    if unknown := set(forms) - set(get_args(PayloadForm)):
        print(f"--forms: unknown payload forms {sorted(unknown)}; they are {get_args(PayloadForm)}", file=sys.stderr)
        return 2
    ensure_embedded_server(args.port, conf=json.loads(os.environ.get(_CONF_ENV, "{}")), detach=True)
    try:
        warm_up(args.port, forms)
    except WarmUpFailed as failed:
        log.error("%s", failed)
        return 1
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "warm-up",
        help="start the embedded Spark server when none runs (it stays for the runs) and warm it up with scratch "
        "loads, so that the first run after a start is as fast as the next ones",
    )
    parser.add_argument(
        "--port", type=int, default=installation_port(), help=f"its port (default {installation_port()})"
    )
    parser.add_argument("--forms", default="json", help="the payload forms to warm, comma-separated (default json)")
    parser.set_defaults(func=_warm_up_command)
