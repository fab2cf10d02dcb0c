"""Spark sessions: the one place that creates them (`spark_session`, for a `SparkSettings.mode`).

* ``remote``: a Spark Connect client for ``sc://host:port`` (production clusters; Delta is the
  cluster's business).
* ``embedded`` (default): a thin Connect client of the embedded Spark Connect server
  (`connect_server.ensure_embedded_server` starts it on first use, or reuses the one running).
* ``local``: a classic in-process ``local[*]`` SparkSession with the same Delta configuration (tests).

A classic session and a Connect session cannot live in one Python process (pyspark refuses the
second, and the process-wide ``SPARK_CONNECT_MODE_ENABLED`` flag switches ``pyspark.sql.functions``
to Connect): pick one mode per process.

Every session gets the lakehouse's S3 settings and credentials as runtime settings when it is made
(`apply_storage`), so a server started without them serves them. A server keeps the ``s3a`` file system
of a bucket it opened (endpoint, keys) until it restarts, unless the storage asks for fresh file systems
(`S3Storage.fresh_file_systems`: keys rotated, another endpoint, on a running server). The `feedapi`
data source is registered where it is read, by `FeedLoader` (`register_feed_source`; for a cluster,
with this package as a Spark Connect artifact, and a user's protocol's package for every Connect
server: `artifacts.py`), whoever made the session.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from feedapi_dagster.lakehouse import connect_server
from feedapi_dagster.lakehouse.artifacts import package_zip, protocol_zip
from feedapi_dagster.lakehouse.connect_server import ensure_embedded_server, register_client
from feedapi_dagster.lakehouse.spark_conf import LOCAL_MASTER, LOOPBACK, SparkSettings, build_conf
from feedapi_dagster.lakehouse.spark_errors import is_source_name_taken
from feedapi_dagster.lakehouse.storage import SESSION_KEYS, S3Storage
from feedapi_dagster.protocol.registry import DEFAULT_PROTOCOL, protocol_module

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


def is_connect(session: Any) -> bool:
    return type(session).__module__.startswith("pyspark.sql.connect")


def connect_session(
    url: str, conf: Mapping[str, str] | None = None, *, storage: S3Storage | None = None
) -> SparkSession:
    """A Spark Connect client session for ``url`` (``conf``: runtime SQL settings; ``storage``: the
    lakehouse's S3 settings and credentials, given to the session: `apply_storage`)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(url)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    register_client(urlsplit(url).port, session)
    apply_storage(session, storage, conf)
    return session


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


# Sessions that have the `feedapi` data source (weakly: an id() of a collected session is reused).
_with_source: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def register_feed_source(spark: SparkSession, ship: bool = False, protocol: str = DEFAULT_PROTOCOL) -> None:
    """Register `FeedDataSource` as `feedapi` in the session, once (`FeedLoader` does, before its first
    read). `ship`: also send this package to the session's executors as a Spark Connect artifact (a
    cluster whose Python does not have feedapi-dagster installed; its wheels - msgspec, pyarrow,
    requests, pydantic - must be there). `protocol`: the feed's; a user's protocol's package goes to
    a Connect session's Python workers with each load (`protocol_zip`; a local session's workers are
    this process's environment's)."""
    from feedapi_dagster.lakehouse.datasource import FeedDataSource

    module = protocol_module(protocol)
    if module is not None and is_connect(spark):
        spark.addArtifacts(str(protocol_zip(module)), pyfile=True)
    if spark in _with_source:
        return
    if ship:
        spark.addArtifacts(str(package_zip()), pyfile=True)
    try:
        spark.dataSource.register(FeedDataSource)
    except Exception as error:
        # Spark checks the name, then registers, without a lock (`DataSourceRegistration.
        # checkDataSourceExists`): not registered in the session yet, so it looks the name up as any
        # data source, and finds the `feedapi` that another client of the same server-side session
        # (every client of the embedded server: `SparkConnectServer.client_url`) registered in between.
        # Registered now, so the name passes the check this time; a JVM source named `feedapi` (the
        # check's real purpose) fails it again.
        if not is_source_name_taken(error):
            raise
        spark.dataSource.register(FeedDataSource)
    _with_source.add(spark)


Logger = logging.Logger | logging.LoggerAdapter


def spark_session(settings: SparkSettings | None = None, logger: Logger | None = None) -> SparkSession:
    """The session for ``settings.mode`` (embedded: ensure the server runs, then connect), with the
    lakehouse's S3 settings and credentials (``settings.s3``, read now) as its runtime settings.
    ``logger`` (a Dagster run's log) is told what the embedded server's start says (its port, log
    file and pid: the first run after a machine start waits for it, ~40 s), then which Spark the
    session is and where its UI is."""
    settings = settings or SparkSettings()
    with _server_messages_to(logger):
        session = _session(settings)
    if logger is not None:
        logger.info("Spark: %s; Spark UI: %s", _where(settings), spark_ui_url(session, settings) or _no_ui(settings))
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
    """What `connect_server` says while the session is made (a server started, where its log is, that
    it stays) goes to `logger` as well."""
    if logger is None:
        yield
        return
    source = logging.getLogger(connect_server.__name__)
    level, forward = source.level, _Forward(logger)
    source.addHandler(forward)
    if not source.isEnabledFor(logging.INFO):
        source.setLevel(logging.INFO)
    try:
        yield
    finally:
        source.removeHandler(forward)
        source.setLevel(level)


def _session(settings: SparkSettings) -> SparkSession:
    if settings.s3 is not None:
        settings.s3.credentials()  # a variable named by *_env that is not set: StorageError before any JVM
    if settings.mode == "local":
        session = local_spark_session(settings.conf, work_dir=settings.work_dir, storage=settings.s3)
    elif settings.mode == "remote":
        assert settings.remote is not None
        session = connect_session(settings.remote, settings.conf, storage=settings.s3)
    else:
        # the URL carries the server's token: built here, never part of any configuration; the
        # server's `conf` (settings.conf) is not the session's
        server = ensure_embedded_server(
            settings.port, conf=settings.conf, work_dir=settings.work_dir, detach=settings.detach_server
        )
        session = connect_session(server.client_url())
        apply_storage(session, settings.s3, settings.conf)
    return session
