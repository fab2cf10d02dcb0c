"""Spark configuration: the settings that say how to get a session (`SparkSettings`: embedded, remote
or local) and the configuration of the Spark this package starts (an embedded Spark Connect server or
a local session).

No Spark this package starts ever resolves packages: ``spark.jars`` points at the jars
`setup_delta_jars` cached (`delta_conf`), and ``spark.jars.ivy``, the warehouse, Derby and scratch
dirs live in a work dir (`prepare_work_dir`: a temp dir unless configured), never in the current
directory; log4j writes WARN and above to stderr. `build_conf` is the whole configuration of an
embedded server or local session. Starting the server is `connect_server`'s business; making sessions
is `sessions`'.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from feedapi_dagster.spark.jars import delta_jars
from feedapi_dagster.spark.storage import S3Storage

# The embedded server's port when `spark.port` is not set: one per installation (`installation_port`),
# below the kernel's ephemeral ports (32768 and up), where clients' own sockets come from.
EMBEDDED_PORTS = range(15100, 16000)
LOOPBACK = "127.0.0.1"
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"

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

# Short-lived JVMs doing small jobs: C1 only, which starts the Connect server and its first Delta
# client markedly sooner (benchmarks/README.md, "Start-up choices"). Long, CPU-heavy
# jobs want C2 back: pass spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=4 (the last flag wins).
# One code cache of 512 MB (reserved; committed as used): a JVM that lives long (the embedded server,
# a test run's session) compiles many generated classes and method handles, and the small segment
# the segmented cache keeps for method handle intrinsics ran out in a full test run ("Out of space in
# CodeCache for method handle intrinsic": the query failed).
QUICK_START_JAVA_OPTIONS: tuple[str, ...] = (
    "-XX:TieredStopAtLevel=1",
    "-XX:-SegmentedCodeCache",
    "-XX:ReservedCodeCacheSize=512m",
)
FULL_JIT_JAVA_OPTION = "-XX:TieredStopAtLevel=4"

_LOOPBACK_CONF: dict[str, str] = {
    "spark.driver.host": LOOPBACK,
    "spark.driver.bindAddress": LOOPBACK,
}

_LOG4J2 = """\
# written by feedapi_dagster.spark.settings: WARN and above, to stderr
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


# --------------------------------------------------------------------------------------------
# settings


def this_installation() -> str:
    """The Python environment this package runs in: one installation per virtualenv."""
    return str(Path(sys.prefix).resolve())


def installation_port() -> int:
    """The embedded server's port of this installation, the same in each of its processes: another
    project's virtualenv on the machine gets its own port, so its runs never reach this installation's
    server (whose Python workers run this installation's Python, packages and jars), nor ours its."""
    digest = hashlib.sha256(this_installation().encode()).digest()
    return EMBEDDED_PORTS[int.from_bytes(digest[:8], "big") % len(EMBEDDED_PORTS)]


class SparkSettings(BaseModel):
    """How to get a Spark session.

    ``conf``: for ``embedded`` and ``local``, Spark configuration of the server / session (static
    settings included); for ``remote``, runtime SQL settings of the client session.
    ``s3``: the lakehouse's S3 storage, whose settings and credentials every session gets (embedded,
    remote and local alike) as runtime settings, read when the session is made.
    ``work_dir``: where the embedded server / local session keep warehouse, Derby, Ivy, scratch and
    log files (default: a temp dir removed when the server stops).
    ``port``: the embedded server's; by default this installation's own (`installation_port`).
    ``detach_server``: an embedded server started by this process outlives it (for short-lived
    processes sharing one server); otherwise it is stopped when the process exits.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["embedded", "remote", "local"] = "embedded"
    remote: str | None = None
    port: int = Field(default_factory=installation_port, ge=1, le=65535)
    conf: dict[str, str] = Field(default_factory=dict)
    work_dir: Path | None = None
    detach_server: bool = False
    # remote: send this package to the cluster as a Spark Connect artifact (off when the cluster's
    # Python has feedapi-dagster installed, e.g. baked into its image)
    ship_package: bool = True
    # the lakehouse's S3 storage, set by `ProjectConfig.spark_settings` from its `storage.s3` (not a
    # setting of the `spark` block): its s3a settings and credentials go into every session's settings
    # when the session is made (`S3Storage.session_conf`), never into `conf`
    s3: S3Storage | None = None

    @field_validator("conf", mode="before")
    @classmethod
    def _stringify_conf(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _check_mode(self) -> SparkSettings:
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
        "spark.driver.extraJavaOptions": " ".join(
            [
                _java_opt("derby.system.home", work_dir / "derby"),
                _java_opt("log4j2.configurationFile", log4j.as_uri()),
            ]
        ),
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
