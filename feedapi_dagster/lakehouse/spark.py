"""Spark sessions: the one place that creates them.

Three modes (`SparkSettings.mode`):

* ``remote``: a Spark Connect client for ``sc://host:port`` (production clusters; Delta is the
  cluster's business).
* ``embedded`` (default): a Spark Connect server started from the pip-installed pyspark as a child
  JVM (``spark-submit --class ...SparkConnectServer``) with the cached Delta jars, bound to 127.0.0.1
  only, and a thin Connect client to it. `ensure_embedded_server` reuses a server already listening
  on the port, so a short-lived process (a Dagster run) only pays for a client. The server runs
  Python for whoever reaches its port, so it requires Spark Connect's authentication token: one per
  server, handed to its clients through a file only this user can read (`token_file`).
* ``local``: a classic in-process ``local[*]`` SparkSession with the same Delta configuration (tests).

A classic session and a Connect session cannot live in one Python process (pyspark refuses the
second, and the process-wide ``SPARK_CONNECT_MODE_ENABLED`` flag switches ``pyspark.sql.functions``
to Connect): pick one mode per process.

No session ever resolves packages: ``spark.jars`` points at the jars `setup_delta_jars` cached, and
``spark.jars.ivy``, the warehouse, Derby and scratch dirs live in a work dir (a temp dir unless
configured), never in the current directory.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal, Mapping, Sequence
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from feedapi_dagster.lakehouse.jars import delta_jars, pyspark_home

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_PORT = 15002
LOOPBACK = "127.0.0.1"
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
SETTINGS_ENV_PREFIX = "FEEDAPI_DAGSTER_SPARK_"

DELTA_SQL_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

# Small, local work: few shuffle partitions, no UI, small Delta snapshot state, UTC timestamps.
SMALL_WORK_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.session.timeZone": "UTC",
}

# Task attempts before a job fails, as a cluster's `spark.task.maxFailures` (local mode's default is
# 1: a Python worker that dies would fail the load instead of being retried).
LOCAL_MASTER = "local[*,4]"

# Short-lived JVMs doing small jobs: C1 only. Measured on 2 cores: Connect server ready in ~7-10 s
# instead of ~13-14 s, first Delta client on a cold server ~22 s instead of ~30-39 s. Long, CPU-heavy
# jobs want C2 back: pass spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=4 (the last flag wins).
QUICK_START_JAVA_OPTIONS: tuple[str, ...] = ("-XX:TieredStopAtLevel=1",)
FULL_JIT_JAVA_OPTION = "-XX:TieredStopAtLevel=4"

_LOOPBACK_CONF: dict[str, str] = {
    "spark.driver.host": LOOPBACK,
    "spark.driver.bindAddress": LOOPBACK,
}

_LOG4J2 = """\
# written by feedapi_dagster.lakehouse.spark: WARN and above, to stderr
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.connectserver.name = org.apache.spark.sql.connect.service.SparkConnectServer
logger.connectserver.level = info
logger.nativecode.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativecode.level = error
logger.hiveconf.name = org.apache.hadoop.hive.conf.HiveConf
logger.hiveconf.level = error
"""


class SparkStartupError(RuntimeError):
    """A Spark session or Spark Connect server could not be started."""


# --------------------------------------------------------------------------------------------
# settings


class SparkSettings(BaseModel):
    """How to get a Spark session.

    ``conf``: for ``embedded`` and ``local``, Spark configuration of the server / session (static
    settings included); for ``remote``, runtime SQL settings of the client session.
    ``work_dir``: where the embedded server / local session keep warehouse, Derby, Ivy, scratch and
    log files (default: a temp dir removed when the server stops).
    ``detach_server``: an embedded server started by this process outlives it (for short-lived
    processes sharing one server); otherwise it is stopped when the process exits.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["embedded", "remote", "local"] = "embedded"
    remote: str | None = None
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    conf: dict[str, str] = Field(default_factory=dict)
    work_dir: Path | None = None
    detach_server: bool = False
    # remote: send this package to the cluster as a Spark Connect artifact (off when the cluster's
    # Python has feedapi-dagster installed, e.g. baked into its image)
    ship_package: bool = True
    # embedded and local: variables of the Spark JVM started here, each read from the variable of this
    # process it names (the lakehouse's credentials: `ProjectConfig.spark_settings`); never in `conf`
    credential_env: dict[str, str] = Field(default_factory=dict)

    @field_validator("conf", mode="before")
    @classmethod
    def _stringify_conf(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _check_mode(self) -> "SparkSettings":
        if self.mode == "remote":
            if not self.remote:
                raise ValueError("mode 'remote' needs `remote`, a Spark Connect URL such as sc://spark-host:15002")
            if not self.remote.startswith("sc://"):
                raise ValueError(
                    f"`remote` must be a Spark Connect URL starting with sc:// (e.g. sc://spark-host:15002), "
                    f"got {self.remote!r}"
                )
        elif self.remote is not None:
            raise ValueError(f"`remote` is only used with mode 'remote' (mode is {self.mode!r}); drop it or set mode")
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "SparkSettings":
        """Read FEEDAPI_DAGSTER_SPARK_{MODE,REMOTE,PORT,WORK_DIR,DETACH_SERVER}; keyword overrides win."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in ("mode", "remote", "port", "work_dir", "detach_server"):
            raw = environ.get(SETTINGS_ENV_PREFIX + field.upper())
            if raw:
                values[field] = raw
        values.update(overrides)
        return cls(**values)


# --------------------------------------------------------------------------------------------
# configuration


def delta_conf(jars: Sequence[Path] | None = None) -> dict[str, str]:
    """``spark.jars`` (the cached Delta jars) plus the Delta SQL extension and catalog."""
    jars = delta_jars() if jars is None else jars
    return {"spark.jars": ",".join(str(p) for p in jars), **DELTA_SQL_CONF}


def _java_opt(key: str, value: Path | str) -> str:
    opt = f"-D{key}={value}"
    return f'"{opt}"' if " " in opt else opt


def prepare_work_dir(work_dir: Path) -> dict[str, str]:
    """Create the work dir layout and return the settings that keep Spark's files inside it."""
    work_dir = Path(work_dir).resolve()
    for sub in ("warehouse", "derby", "ivy", "tmp"):
        (work_dir / sub).mkdir(parents=True, exist_ok=True)
    log4j = work_dir / "log4j2.properties"
    if not log4j.exists():
        log4j.write_text(_LOG4J2)
    return {
        "spark.sql.warehouse.dir": str(work_dir / "warehouse"),
        "spark.jars.ivy": str(work_dir / "ivy"),
        "spark.driver.extraJavaOptions": " ".join([
            _java_opt("derby.system.home", work_dir / "derby"),
            _java_opt("log4j2.configurationFile", log4j.as_uri()),
        ]),
    }


def build_conf(
    work_dir: Path,
    conf: Mapping[str, str] | None = None,
    *,
    jars: Sequence[Path] | None = None,
    java_options: Sequence[str] = (),
) -> dict[str, str]:
    """Full configuration of an embedded server / local session; ``conf`` wins, except that its
    ``spark.driver.extraJavaOptions`` is appended to ours."""
    merged = {**SMALL_WORK_CONF, **delta_conf(jars), **_LOOPBACK_CONF, **prepare_work_dir(work_dir)}
    extra_java = [merged["spark.driver.extraJavaOptions"], *QUICK_START_JAVA_OPTIONS, *java_options]
    for key, value in (conf or {}).items():
        if key == "spark.driver.extraJavaOptions":
            extra_java.append(value)
        else:
            merged[key] = value
    merged["spark.driver.extraJavaOptions"] = " ".join(o for o in extra_java if o)
    if "spark.jars.packages" in merged:
        raise ValueError("spark.jars.packages is not allowed: Delta comes from the cached jars (spark.jars)")
    return merged


# --------------------------------------------------------------------------------------------
# local (classic, in-process)


def local_spark_session(
    conf: Mapping[str, str] | None = None,
    *,
    work_dir: Path | None = None,
    master: str = LOCAL_MASTER,
    app_name: str = "feedapi-dagster",
    env: Mapping[str, str] | None = None,
) -> "SparkSession":
    """A classic in-process SparkSession with Delta; returns the existing one if there is one.
    ``env``: variables the JVM needs (credentials), set in this process, which the JVM inherits."""
    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()
    if existing is not None and not is_connect(existing):
        return existing
    os.environ.update(env or {})
    if work_dir is None:
        work_dir = Path(tempfile.mkdtemp(prefix="feedapi-dagster-spark-"))
        atexit.register(shutil.rmtree, work_dir, True)
    settings = build_conf(Path(work_dir), conf)
    # Read when the JVM starts: Python workers (UDFs) run this interpreter, not whatever `python3` is
    # on PATH; scratch files go to the work dir (the spark.local.dir setting only earns a warning).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    os.environ.setdefault("SPARK_LOCAL_DIRS", str(Path(work_dir).resolve() / "tmp"))
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def is_connect(session: Any) -> bool:
    return type(session).__module__.startswith("pyspark.sql.connect")


# --------------------------------------------------------------------------------------------
# Spark Connect server


def find_free_port(host: str = LOOPBACK) -> int:
    """An ephemeral port that is free right now on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_open(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _tail(path: Path | None, lines: int = 40) -> str:
    if path is None:
        return "(no log)"
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


_SESSION_NAMESPACE = uuid.UUID("0b0e7d2c-6f5e-4f43-9a43-8f3c1b7e2a51")


def token_file(port: int) -> Path:
    """Where the embedded server on `port` keeps its authentication token (mode 0600)."""
    return Path(tempfile.gettempdir()) / f"feedapi-dagster-spark-{port}.token"


def _write_token(port: int) -> str:
    token = secrets.token_urlsafe(32)
    path = token_file(port)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token)
    return token


def read_token(port: int) -> str:
    """The token of the embedded server on `port`; refuses a file someone else could have written or read."""
    path = token_file(port)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise SparkStartupError(f"a Spark Connect server listens on port {port}, but {path} (its token) is "
                                "missing: it was not started by feedapi-dagster as this user") from None
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise SparkStartupError(f"{path} must belong to this user with mode 0600; not using it")
    return path.read_text().strip()


class SparkConnectServer:
    """A Spark Connect server in a child JVM (``spark-submit --class SparkConnectServer``).

    ``SparkConnectServer(port).start()`` or ``with SparkConnectServer(port) as server: ...``;
    ``server.url`` is ``sc://127.0.0.1:<port>``. `attach` makes a handle for a server someone else
    runs (``stop()`` then does nothing).
    """

    def __init__(
        self,
        port: int = DEFAULT_PORT,
        *,
        conf: Mapping[str, str] | None = None,
        work_dir: Path | None = None,
        jars: Sequence[Path] | None = None,
        java_options: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 180.0,
        detach: bool = False,
    ) -> None:
        self.port = port
        self.host = LOOPBACK
        self.startup_timeout = startup_timeout
        self.detach = detach
        self._conf = dict(conf or {})
        self._jars = jars
        self._java_options = list(java_options)
        self._env = dict(env or {})
        self._work_dir = Path(work_dir).resolve() if work_dir is not None else None
        self._remove_work_dir = False
        self._proc: subprocess.Popen | None = None
        self._log_file: Any = None
        self._owned = True
        self.log_path: Path | None = None

    # -- handles ----------------------------------------------------------------------------

    @classmethod
    def attach(cls, port: int = DEFAULT_PORT) -> "SparkConnectServer":
        """A handle for a server already listening on 127.0.0.1:<port> that this process does not own."""
        server = cls(port)
        server._owned = False
        return server

    @property
    def url(self) -> str:
        """For display: the server's address, without its token."""
        return f"sc://{self.host}:{self.port}"

    def client_url(self) -> str:
        """The Spark Connect URL a client connects with: the token goes over a local channel (gRPC's
        local credentials, which pyspark uses for `localhost` with a token). Every client of this
        server joins one server-side session: a session has Python workers of its own, and a new one
        per run would start and import them again in every run (400k events: 5.6 s to stage a read in
        a new session, 2.5 s in the shared one)."""
        token = read_token(self.port)
        return f"sc://localhost:{self.port}/;token={token};session_id={uuid.uuid5(_SESSION_NAMESPACE, token)}"

    @property
    def owned(self) -> bool:
        return self._owned

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def work_dir(self) -> Path | None:
        return self._work_dir

    def is_running(self) -> bool:
        if not self._owned:
            return port_open(self.port, self.host)
        return self._proc is not None and self._proc.poll() is None

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"<SparkConnectServer {self.url} {state} pid={self.pid} owned={self._owned}>"

    def __enter__(self) -> "SparkConnectServer":
        if self._owned and self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- life cycle -------------------------------------------------------------------------

    def command(self) -> list[str]:
        """The spark-submit command line (configuration included)."""
        if self._work_dir is None:
            raise RuntimeError("work dir not prepared")
        # The server lives long and does the loads' heavy lifting (JSON functions, Parquet encoding),
        # where C1-only code is slow (the benchmark's JVM time per commit): full JIT (C2) back.
        conf = build_conf(self._work_dir, self._conf, jars=self._jars,
                          java_options=(FULL_JIT_JAVA_OPTION, *self._java_options))
        conf.update({
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
            # fail instead of silently moving to port+1 when the port is taken
            "spark.connect.grpc.port.maxRetries": "0",
        })
        cmd = [
            str(pyspark_home() / "bin" / "spark-submit"),
            "--master", conf.pop("spark.master", LOCAL_MASTER),
            "--name", conf.pop("spark.app.name", "feedapi-dagster-connect"),
            "--class", CONNECT_SERVER_CLASS,
        ]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        cmd.append("spark-internal")
        return cmd

    def _child_env(self) -> dict[str, str]:
        home = pyspark_home()
        env = {k: v for k, v in os.environ.items()
               if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "PYSPARK_SUBMIT_ARGS")}
        env.update(
            SPARK_HOME=str(home),
            SPARK_LOCAL_IP=LOOPBACK,
            SPARK_LOCAL_DIRS=str(self._work_dir / "tmp"),
            # Python UDFs sent by clients run in workers of this interpreter (same version as the client)
            PYSPARK_PYTHON=sys.executable,
        )
        env.update(self._env)
        return env

    def start(self) -> "SparkConnectServer":
        if not self._owned:
            raise RuntimeError(f"{self.url} is not owned by this handle")
        if self.is_running():
            return self
        if port_open(self.port, self.host):
            raise SparkStartupError(f"cannot start a Spark Connect server: port {self.port} is already in use")
        if self._work_dir is None:
            if self.detach:
                self._work_dir = Path(tempfile.gettempdir()) / f"feedapi-dagster-spark-{self.port}"
            else:
                self._work_dir = Path(tempfile.mkdtemp(prefix=f"feedapi-dagster-spark-{self.port}-"))
                self._remove_work_dir = True
        self._work_dir.mkdir(parents=True, exist_ok=True)
        # in the server's environment, not its command line (which `ps` shows to every user)
        self._env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = _write_token(self.port)
        cmd = self.command()
        self.log_path = self._work_dir / "spark-connect-server.log"
        self._log_file = open(self.log_path, "ab")
        log.info("Starting Spark Connect server on %s (log: %s)", self.url, self.log_path)
        started = time.monotonic()
        self._proc = subprocess.Popen(
            cmd,
            cwd=self._work_dir,
            env=self._child_env(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() reaches every child, Ctrl-C does not
        )
        try:
            self._wait_ready()
        except BaseException as exc:
            tail = _tail(self.log_path)
            self.stop()
            if not isinstance(exc, SparkStartupError):
                raise
            raise SparkStartupError(
                f"Spark Connect server on {self.url} did not start ({exc}); last log lines:\n{tail}"
            ) from None
        log.info("Spark Connect server ready on %s after %.1f s (pid %s)", self.url,
                 time.monotonic() - started, self.pid)
        return self

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise SparkStartupError(f"server exited with code {code}")
            if port_open(self.port, self.host, timeout=0.25):
                return
            time.sleep(0.2)
        raise SparkStartupError(f"server not listening after {self.startup_timeout:.0f} s")

    def stop(self, timeout: float = 30.0) -> None:
        """Terminate (SIGTERM to the process group), wait, kill after ``timeout``; idempotent."""
        if not self._owned or self._proc is None:
            return
        _close_clients(self.port)
        proc = self._proc
        if proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("Spark Connect server pid %s ignored SIGTERM for %.0f s; killing it", proc.pid, timeout)
                self._signal_group(signal.SIGKILL)
                proc.wait(timeout=10)
        # leftovers of the group (python workers) after the JVM exited
        self._signal_group(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while self._group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._remove_work_dir and self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            token_file(self.port).unlink()
        if _started.get(self.port) is self:
            del _started[self.port]

    def _signal_group(self, sig: int) -> None:
        assert self._proc is not None
        try:
            os.killpg(self._proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _group_alive(self) -> bool:
        """Whether a live (non-zombie) process is left in the server's process group."""
        assert self._proc is not None
        pgid = self._proc.pid
        proc_root = Path("/proc")
        if not proc_root.is_dir():  # pragma: no cover - not Linux
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return False
            return True
        for stat in proc_root.glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                return True
        return False

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the server process to exit; its exit code (None if still running after timeout)."""
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


_started: dict[int, SparkConnectServer] = {}


@contextlib.contextmanager
def _port_lock(port: int) -> Iterator[None]:
    """Serialise server start-up on a port between processes (two Dagster runs starting at once)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = Path(tempfile.gettempdir()) / f"feedapi-dagster-spark-{port}.lock"
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def start_embedded_server(
    port: int = DEFAULT_PORT,
    *,
    conf: Mapping[str, str] | None = None,
    work_dir: Path | None = None,
    detach: bool = False,
    startup_timeout: float = 180.0,
    env: Mapping[str, str] | None = None,
) -> SparkConnectServer:
    """Start a Spark Connect server with Delta on 127.0.0.1:<port> (fails if the port is taken);
    ``env``: variables added to its environment (credentials)."""
    return SparkConnectServer(port, conf=conf, work_dir=work_dir, detach=detach, env=env,
                              startup_timeout=startup_timeout).start()


def ensure_embedded_server(
    port: int = DEFAULT_PORT,
    *,
    conf: Mapping[str, str] | None = None,
    work_dir: Path | None = None,
    detach: bool = False,
    startup_timeout: float = 180.0,
    env: Mapping[str, str] | None = None,
) -> SparkConnectServer:
    """Reuse the server listening on 127.0.0.1:<port>, or start one.

    A server started here is stopped when this process exits unless ``detach`` (then it keeps
    running for later processes; its files are in ``<tmp>/feedapi-dagster-spark-<port>``). A reused
    server keeps its own configuration: ``conf`` and ``env`` only apply to a server started here.
    """
    server = _started.get(port)
    if server is not None and server.is_running():
        return server
    if port_open(port):
        log.info("Reusing the Spark Connect server on sc://%s:%d", LOOPBACK, port)
        return SparkConnectServer.attach(port)
    with _port_lock(port):
        if port_open(port):
            log.info("Reusing the Spark Connect server on sc://%s:%d", LOOPBACK, port)
            return SparkConnectServer.attach(port)
        server = start_embedded_server(port, conf=conf, work_dir=work_dir, detach=detach,
                                       startup_timeout=startup_timeout, env=env)
    if not detach:
        atexit.register(server.stop)
    _started[port] = server
    return server


# --------------------------------------------------------------------------------------------
# sessions


def connect_session(url: str, conf: Mapping[str, str] | None = None) -> "SparkSession":
    """A Spark Connect client session for ``url`` (``conf``: runtime SQL settings)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(url)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    _clients.append((urlsplit(url).port, session))
    return session


# Connect sessions of this process and their servers' ports: a server this process stops closes its
# clients first, or their exit hook would wait up to 10 minutes (pyspark's retry policy) for it.
_clients: list[tuple[int | None, "SparkSession"]] = []


def _close_clients(port: int) -> None:
    for entry in list(_clients):
        if entry[0] == port:
            with contextlib.suppress(Exception):
                entry[1].client.close()
            _clients.remove(entry)


# Sessions that have the `feedapi` data source (weakly: an id() of a collected session is reused).
_with_source: "weakref.WeakSet[SparkSession]" = weakref.WeakSet()


def register_feed_source(spark: "SparkSession", ship: bool = False) -> None:
    """Register `FeedDataSource` as `feedapi` in the session, once. `ship`: also send this package to
    the session's executors as a Spark Connect artifact (a cluster whose Python does not have
    feedapi-dagster installed; its wheels - msgspec, pyarrow, requests, pydantic - must be there)."""
    from feedapi_dagster.lakehouse.datasource import FeedDataSource

    if spark in _with_source:
        return
    if ship:
        spark.addArtifacts(str(package_zip()), pyfile=True)
    spark.dataSource.register(FeedDataSource)
    _with_source.add(spark)


def package_zip() -> Path:
    """This package as a zip of its Python sources, made once per installed version of the files."""
    root = Path(__file__).resolve().parents[1]
    sources = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    stamp = max(p.stat().st_mtime_ns for p in sources)
    target = Path(tempfile.gettempdir()) / f"feedapi_dagster-{os.getuid()}-{stamp}.zip"
    if not target.exists():
        partial = target.with_suffix(f".{os.getpid()}.part")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sources:
                archive.write(path, path.relative_to(root.parent))
        partial.replace(target)
    return target


def spark_session(settings: SparkSettings | None = None) -> "SparkSession":
    """The session for ``settings.mode`` (embedded: ensure the server runs, then connect)."""
    from feedapi_dagster.lakehouse.storage import read_credentials

    settings = settings or SparkSettings()
    if settings.mode == "local":
        session = local_spark_session(settings.conf, work_dir=settings.work_dir,
                                      env=read_credentials(settings.credential_env))
    elif settings.mode == "remote":
        assert settings.remote is not None
        session = connect_session(settings.remote, settings.conf)
    else:
        # the URL carries the server's token: built here, never part of any configuration
        server = ensure_embedded_server(settings.port, conf=settings.conf, work_dir=settings.work_dir,
                                        detach=settings.detach_server, env=read_credentials(settings.credential_env))
        session = connect_session(server.client_url())
    register_feed_source(session, ship=settings.mode == "remote" and settings.ship_package)
    return session
