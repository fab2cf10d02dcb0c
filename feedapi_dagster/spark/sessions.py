"""Spark sessions: the one place that creates them (`spark_session`, for a `SparkSettings.mode`).

* ``remote``: a Spark Connect client for ``sc://host:port`` (production clusters; Delta is the
  cluster's business).
* ``embedded`` (default): a thin Connect client of the embedded Spark Connect server
  (`embedded.ensure_embedded_server` starts it on first use, or reuses the one running).
* ``local``: a classic in-process ``local[*]`` SparkSession with the same Delta configuration (tests).

A classic session and a Connect session cannot live in one Python process (pyspark refuses the
second, and the process-wide ``SPARK_CONNECT_MODE_ENABLED`` flag switches ``pyspark.sql.functions``
to Connect): pick one mode per process.

Every session gets the lakehouse's S3 settings and credentials as runtime settings when it is made
(`apply_storage`), so a server started without them serves them. A server keeps the ``s3a`` file system
of a bucket it opened (endpoint, keys) until it restarts, unless the storage asks for fresh file systems
(`S3Storage.fresh_file_systems`: keys rotated, another endpoint, on a running server). The `feedapi`
data source is registered where it is read, by the loads (`read.registration.register_feed_source`;
for a cluster, with this package as a Spark Connect artifact, and a user's protocol's package for every
Connect server: `artifacts.py`), whoever made the session.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import shutil
import sys
import tempfile
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

from feedapi_dagster.errors import SparkError
from feedapi_dagster.spark import connect_server, embedded
from feedapi_dagster.spark.connect_server import register_client
from feedapi_dagster.spark.embedded import ensure_embedded_server
from feedapi_dagster.spark.settings import LOCAL_MASTER, LOOPBACK, SparkSettings, build_conf
from feedapi_dagster.spark.storage import SESSION_KEYS, S3Storage
from feedapi_dagster.spark.watchdog import DEFAULT_UNRESPONSIVE_SECONDS, answering, is_connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def local_spark_session(
    conf: Mapping[str, str] | None = None,
    *,
    work_dir: Path | None = None,
    master: str = LOCAL_MASTER,
    app_name: str = "feedapi-dagster",
    storage: S3Storage | None = None,
) -> SparkSession:
    """A classic in-process SparkSession with Delta; returns the existing one if there is one.
    ``storage``: the lakehouse's S3 settings and credentials, given to the session (`apply_storage`)."""
    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()
    if existing is not None and not is_connect(existing):
        apply_storage(existing, storage, conf)
        return existing
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
    apply_storage(session, storage, conf)
    return session


def connect_session(
    url: str,
    conf: Mapping[str, str] | None = None,
    *,
    storage: S3Storage | None = None,
    unresponsive_seconds: float = DEFAULT_UNRESPONSIVE_SECONDS,
) -> SparkSession:
    """A Spark Connect client session for ``url`` (``conf``: runtime SQL settings; ``storage``: the
    lakehouse's S3 settings and credentials, given to the session: `apply_storage`). Its calls to the
    server, from the first, are watched (`watchdog.answering`): a server that does not answer them within
    ``unresponsive_seconds`` ends it with `SparkUnresponsive`."""
    session = _connect_client(url, unresponsive_seconds)
    with answering(session, SET_UP, unresponsive_seconds=unresponsive_seconds):
        _set_runtime_conf(url, conf)
        apply_storage(session, storage, conf)
    return session


SET_UP = "the set-up of the Spark session"

# pyspark's Connect client retries a call the server refused or dropped (UNAVAILABLE) for at least 10
# minutes (`DefaultPolicy`: 15 retries, up to 60 s apart), past any bound of ours, and a client closed
# by the watchdog only stops once the backoff it sleeps in is over: our clients retry at most
# `_RETRY_BACKOFF_MS` apart, for the bound and `_RETRY_PAST_BOUND_MS` more in all (the watchdog, which
# gives up at the bound, says what happened: `SparkUnresponsive`, not the last retry's gRPC error).
_RETRY_BACKOFF_MS = 1000
_RETRY_PAST_BOUND_MS = 5000


def _connect_client(url: str, unresponsive_seconds: float) -> SparkSession:
    """The Connect session for ``url``, before any call to its server (a session the builder makes
    without settings makes none: the settings are `_set_runtime_conf`'s, under the watchdog), its
    retries bounded by ``unresponsive_seconds``, closed when this process exits."""
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    _refuse_token_without_tls(url)
    session = SparkSession.builder.remote(url).getOrCreate()
    # `SparkConnectClient.set_retry_policies` and `DefaultPolicy`'s arguments are pyspark's public API
    # for the retries (the builder has no setting for them); the first three backoffs are 0.05, 0.2
    # and 0.8 s, the next ones `_RETRY_BACKOFF_MS`, which also caps a delay the server asks for
    retries = 3 + math.ceil((unresponsive_seconds * 1000 + _RETRY_PAST_BOUND_MS) / _RETRY_BACKOFF_MS)
    session.client.set_retry_policies(
        [DefaultPolicy(max_retries=retries, max_backoff=_RETRY_BACKOFF_MS, max_server_retry_delay=_RETRY_BACKOFF_MS)]
    )
    if session not in _closed_at_exit:
        # pyspark's exit hook of a client still open makes a call to its server (it cleans the server's
        # ML cache, which the loads never fill), and waits for ever for one that froze; this hook,
        # registered after pyspark's, runs before it and closes the client, which skips that call
        atexit.register(_close, session)
        _closed_at_exit.add(session)
    register_client(urlsplit(url).port, session)
    return session


@contextlib.contextmanager
def joined_session(url: str, session_id: str, unresponsive_seconds: float) -> Iterator[SparkSession]:
    """A second client of the server at ``url``, in its server-side session ``session_id`` (another
    run's), its retries bounded as `_connect_client`'s; closed at the end without releasing that
    session. It is made with the Connect `SparkSession` class itself: the builder's `create` would make
    it this process's default session."""
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    base = url if "/;" in url else url.rstrip("/") + "/"
    session = cast("SparkSession", ConnectSession(connection=f"{base};session_id={session_id}"))
    retries = 3 + math.ceil((unresponsive_seconds * 1000 + _RETRY_PAST_BOUND_MS) / _RETRY_BACKOFF_MS)
    session.client.set_retry_policies(
        [DefaultPolicy(max_retries=retries, max_backoff=_RETRY_BACKOFF_MS, max_server_retry_delay=_RETRY_BACKOFF_MS)]
    )
    try:
        yield session
    finally:
        _close(session)


def connect_session_id(session: SparkSession) -> str | None:
    """The server-side session a Spark Connect session is (None: a classic session)."""
    return cast("str", session.session_id) if is_connect(session) else None  # type: ignore[attr-defined]


def _refuse_token_without_tls(url: str) -> None:
    """pyspark sends a token (``;token=`` in the URL, or SPARK_CONNECT_AUTHENTICATE_TOKEN) over TLS
    only, except to ``localhost`` (gRPC's local credentials): to any other host without ``use_ssl=true``
    it speaks TLS to a server that does not, and the handshake fails as a server that never answers
    would (pyspark retried it for 14 minutes; our bound would report the server unresponsive).
    `DefaultChannelBuilder` is the URL's reading that pyspark's public `SparkSession.Builder.channelBuilder`
    takes."""
    from pyspark.sql.connect.client import DefaultChannelBuilder

    channel = DefaultChannelBuilder(url)
    if channel.token is not None and not channel.use_ssl and channel.host != "localhost":
        raise SparkError(
            f"the Spark Connect server at sc://{channel.endpoint}: a token (in the URL or in "
            "SPARK_CONNECT_AUTHENTICATE_TOKEN) is sent over TLS only, and the URL has no `;use_ssl=true`: "
            "add it for a TLS endpoint, reach a server on this machine as `localhost`, or unset the token "
            "for a server without authentication"
        )


_closed_at_exit: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def _close(session: SparkSession) -> None:
    with contextlib.suppress(Exception):
        session.client.close()


def _set_runtime_conf(url: str, conf: Mapping[str, str] | None) -> None:
    """Give the session of ``url`` the runtime settings ``conf`` as the builder does (a setting the server
    cannot change at runtime is skipped): the builder sets them on the session it returns, the one
    `_connect_client` made."""
    from pyspark.sql import SparkSession

    if conf:
        SparkSession.builder.remote(url).config(map=dict(conf)).getOrCreate()


def apply_storage(session: SparkSession, storage: S3Storage | None, conf: Mapping[str, str] | None = None) -> None:
    """Give the session the lakehouse's S3 settings and credentials (`S3Storage.session_conf`, the
    credentials read now) as runtime settings, which Spark copies into the Hadoop configuration of the
    session's reads and writes, and unset the other settings `session_conf` may give (`SESSION_KEYS`):
    every client of the embedded server joins one server-side session, where an earlier client's
    endpoint or keys would stay. A setting the session's ``conf`` has (``fs.s3a.x``, or
    ``spark.hadoop.fs.s3a.x`` of a server or local session) is left to it. Nothing for a lakehouse on
    local disk (``storage`` None)."""
    if storage is None:
        return
    own = {key.removeprefix("spark.hadoop.") for key in (conf or {})}
    settings = {key: value for key, value in storage.session_conf().items() if key not in own}
    for key, value in settings.items():
        session.conf.set(key, value)
    for key in SESSION_KEYS:
        if key not in settings and key not in own:
            session.conf.unset(key)


Logger = logging.Logger | logging.LoggerAdapter


def spark_session(
    settings: SparkSettings | None = None,
    logger: Logger | None = None,
    *,
    unresponsive_seconds: float = DEFAULT_UNRESPONSIVE_SECONDS,
) -> SparkSession:
    """The session for ``settings.mode`` (embedded: ensure the server runs, then connect), with the
    lakehouse's S3 settings and credentials (``settings.s3``, read now) as its runtime settings.
    ``logger`` (a Dagster run's log) is told what the embedded server's start says (its port, log
    file and pid: the first run after a machine start waits for it, ~40 s), then which Spark the
    session is and where its UI is. A Spark Connect server that does not answer the session's set-up
    within ``unresponsive_seconds`` (it is frozen, or its port takes connections nobody serves) ends it
    with `SparkUnresponsive` (`watchdog.answering`)."""
    settings = settings or SparkSettings()
    with _server_messages_to(logger):
        session = _session(settings, unresponsive_seconds)
    if logger is not None:
        with answering(session, SET_UP, unresponsive_seconds=unresponsive_seconds):
            ui = spark_ui_url(session, settings) or _no_ui(settings)
        logger.info("Spark: %s; Spark UI: %s", _where(settings), ui)
    return session


def _no_ui(settings: SparkSettings) -> str:
    if settings.mode == "remote":
        return "the cluster driver's (a Spark Connect client cannot tell its address)"
    return "off (spark.ui.enabled is false in the Spark settings' conf; set it to true for one)"


def _where(settings: SparkSettings) -> str:
    if settings.mode == "local":
        return "a local session in this process"
    if settings.mode == "remote":
        return f"the Spark Connect server at sc://{urlsplit(settings.remote or '').netloc}"  # never its token
    return f"the embedded Spark Connect server on sc://{LOOPBACK}:{settings.port}"


def spark_ui_url(session: SparkSession, settings: SparkSettings) -> str | None:
    """The address of the Spark UI of the session's driver, where this client can tell it: a local
    session's, or the embedded server's (its driver binds the UI to the loopback address, on
    `spark.ui.port`); None when the UI is off or the driver is a cluster's."""
    if not is_connect(session):
        return session.sparkContext.uiWebUrl
    if settings.mode != "embedded" or session.conf.get("spark.ui.enabled", "true") != "true":
        return None
    return f"http://{LOOPBACK}:{session.conf.get('spark.ui.port', '4040')}"


class _Forward(logging.Handler):
    def __init__(self, target: Logger):
        super().__init__(logging.INFO)
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        self.target.log(record.levelno, record.getMessage())


@contextlib.contextmanager
def _server_messages_to(logger: Logger | None) -> Iterator[None]:
    """What `connect_server` and `embedded` say while the session is made (a server started or reused,
    where its log is, that it stays) goes to `logger` as well."""
    if logger is None:
        yield
        return
    forward = _Forward(logger)
    sources = [logging.getLogger(module.__name__) for module in (connect_server, embedded)]
    levels = [source.level for source in sources]
    for source in sources:
        source.addHandler(forward)
        if not source.isEnabledFor(logging.INFO):
            source.setLevel(logging.INFO)
    try:
        yield
    finally:
        for source, level in zip(sources, levels, strict=True):
            source.removeHandler(forward)
            source.setLevel(level)


def _session(settings: SparkSettings, unresponsive_seconds: float) -> SparkSession:
    if settings.s3 is not None:
        settings.s3.credentials()  # a variable named by *_env that is not set: StorageError before any JVM
    if settings.mode == "local":
        return local_spark_session(settings.conf, work_dir=settings.work_dir, storage=settings.s3)
    if settings.mode == "remote":
        assert settings.remote is not None
        return connect_session(
            settings.remote, settings.conf, storage=settings.s3, unresponsive_seconds=unresponsive_seconds
        )
    # the URL carries the server's token: built here, never part of any configuration; the server's
    # `conf` (settings.conf) is not the session's (its settings are skipped by `apply_storage`)
    server = ensure_embedded_server(
        settings.port, conf=settings.conf, work_dir=settings.work_dir, detach=settings.detach_server
    )
    session = _connect_client(server.client_url(), unresponsive_seconds)
    with answering(session, SET_UP, unresponsive_seconds=unresponsive_seconds):
        apply_storage(session, settings.s3, settings.conf)
    return session
