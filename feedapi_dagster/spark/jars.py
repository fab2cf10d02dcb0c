"""The lakehouse's jars (Delta Lake, and Hadoop's ``s3a`` file system with the AWS SDK modules it
uses), resolved from Maven once and cached next to the virtualenv.

Spark re-resolves ``spark.jars.packages`` at every start (network, ~30 s). Instead, `setup_delta_jars`
resolves the coordinates ONCE (`jar_resolution`: Spark's own Ivy resolver in a child process, falling
back to ``mvn dependency:copy-dependencies``), drops every jar that pyspark already ships (same artifact
name, whatever the version, or every class already provided by ``pyspark/jars``), copies the rest
into the cache folder and writes ``manifest.json``. Spark sessions then get ``spark.jars`` =
`delta_jars()` and never need the network.

Cache folder: ``$FEEDAPI_DAGSTER_JARS_DIR`` or ``<sys.prefix>/share/feedapi-dagster/delta-jars``.

Delta Connect: Delta 4.4.0 publishes no Spark Connect server plugin on Maven Central (no
``delta-connect-server_2.13`` nor ``delta-connect-server_4.2_2.13``), so the Delta *Python* API
(``DeltaTable``) does not work over Spark Connect; SQL (``DESCRIBE HISTORY``, ``MERGE``, ...) and
DataFrame ``format("delta")`` reads/writes do.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

from feedapi_dagster.spark.jar_resolution import (
    DeltaJarsError,
    ResolvedJar,
    Resolver,
    name_version_splits,
    pyspark_home,
    resolve_jars,
)

log = logging.getLogger(__name__)

DELTA_VERSION = "4.4.0"
SCALA_BINARY_VERSION = "2.13"
# delta-spark_2.13:4.4.0 is built against Spark 4.2.0 (its POM declares spark-sql 4.2.0 as provided).
DELTA_SPARK_COORDINATE = f"io.delta:delta-spark_{SCALA_BINARY_VERSION}:{DELTA_VERSION}"
# Not published for Delta 4.4.0 (checked on Maven Central); kept here so it is one line to add.
DELTA_CONNECT_SERVER_COORDINATE: str | None = None
# `s3a`: hadoop-aws at the Hadoop version pyspark ships, with the AWS SDK v2 modules S3A uses instead of
# the SDK's one-jar `bundle` that hadoop-aws declares (~600 MB; these modules: ~11 MB). The SDK version
# is the one Hadoop 3.5.0 is built with (`aws-java-sdk-v2.version` of hadoop-project 3.5.0).
AWS_SDK_VERSION = "2.35.4"
AWS_SDK_MODULES = ("s3", "s3-transfer-manager", "sts")
AWS_SDK_BUNDLE = "software.amazon.awssdk:bundle"

JARS_DIR_ENV = "FEEDAPI_DAGSTER_JARS_DIR"
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
NOT_SET_UP_MESSAGE = "Delta and s3a jars not set up: run `make setup` or `feedapi-dagster setup-jars`"


class DeltaJarsNotSetUp(DeltaJarsError):
    """The jar cache is missing or incomplete."""


# --------------------------------------------------------------------------------------------
# locations


def pyspark_jars_dir() -> Path:
    return pyspark_home() / "jars"


def jars_dir() -> Path:
    """The cache folder: ``$FEEDAPI_DAGSTER_JARS_DIR`` or ``<sys.prefix>/share/feedapi-dagster/delta-jars``."""
    override = os.environ.get(JARS_DIR_ENV)
    if override:
        return Path(override).expanduser().resolve()
    return Path(sys.prefix) / "share" / "feedapi-dagster" / "delta-jars"


# --------------------------------------------------------------------------------------------
# what to resolve


def _pyspark_artifact_versions() -> dict[str, str]:
    """artifact name -> version for every jar in pyspark/jars (all ``name-version`` splits)."""
    found: dict[str, str] = {}
    for jar in pyspark_jars_dir().glob("*.jar"):
        for name, version in name_version_splits(jar.name):
            found.setdefault(name, version)
    return found


def delta_coordinates() -> list[str]:
    """Maven coordinates to resolve.

    Besides delta-spark, jackson-datatype-jdk8 (a dependency of delta-kernel-defaults, which asks for
    2.13.x) is pinned to the jackson version pyspark ships, so that the one jackson module we add
    matches Spark's jackson-databind instead of being a 2.13 module on a 2.2x databind.
    """
    shipped = _pyspark_artifact_versions()
    coords = [DELTA_SPARK_COORDINATE]
    if DELTA_CONNECT_SERVER_COORDINATE:
        coords.append(DELTA_CONNECT_SERVER_COORDINATE)
    jackson = shipped.get("jackson-databind")
    if jackson:
        coords.append(f"com.fasterxml.jackson.datatype:jackson-datatype-jdk8:{jackson}")
    hadoop = shipped.get("hadoop-client-api")
    if not hadoop:
        raise DeltaJarsError(
            f"pyspark ships no hadoop-client-api jar in {pyspark_jars_dir()}: cannot match hadoop-aws to it"
        )
    coords.append(f"org.apache.hadoop:hadoop-aws:{hadoop}")
    coords += [f"software.amazon.awssdk:{module}:{AWS_SDK_VERSION}" for module in AWS_SDK_MODULES]
    return coords


# left out of the resolution: the AWS SDK's one-jar bundle (its modules are resolved instead)
EXCLUDED = (AWS_SDK_BUNDLE,)


# --------------------------------------------------------------------------------------------
# public API


def read_manifest(directory: Path | None = None) -> dict | None:
    path = (directory or jars_dir()) / MANIFEST_NAME
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def delta_jars(directory: Path | None = None) -> list[Path]:
    """The cached Delta jars (absolute paths, manifest order); raises `DeltaJarsNotSetUp`."""
    directory = directory or jars_dir()
    manifest = read_manifest(directory)
    if manifest is None or not manifest.get("jars"):
        raise DeltaJarsNotSetUp(f"{NOT_SET_UP_MESSAGE} (no manifest at {directory / MANIFEST_NAME})")
    if manifest.get("coordinates") != delta_coordinates():
        raise DeltaJarsNotSetUp(
            f"{NOT_SET_UP_MESSAGE} (the cache in {directory} holds "
            f"{', '.join(manifest.get('coordinates', []))}, set up by an earlier release)"
        )
    paths = [directory / entry["file"] for entry in manifest["jars"]]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise DeltaJarsNotSetUp(f"{NOT_SET_UP_MESSAGE} (missing in {directory}: {', '.join(missing)})")
    return paths


def ensure_delta_jars(echo=print) -> list[Path]:
    """The cached jars, resolved first (with a line saying so) when the cache is empty or stale: what
    `feedapi-dagster demo` and `dev` call, so that installing the wheel is the whole set-up."""
    try:
        return delta_jars()
    except DeltaJarsNotSetUp:
        echo(
            f"The Delta and s3a jars are not set up in {jars_dir()}: resolving them from Maven Central, "
            "once (about a minute) ..."
        )
        return setup_delta_jars()


def setup_delta_jars(
    force: bool = False,
    *,
    resolver: Resolver = "auto",
    directory: Path | None = None,
) -> list[Path]:
    """Resolve the Delta jars into the cache folder once; a no-op (no network) when already done.

    ``resolver``: "ivy" (Spark's own resolver), "maven" (``mvn`` on PATH) or "auto" (Ivy, then Maven).
    """
    directory = directory or jars_dir()
    coordinates = delta_coordinates()
    if not force:
        manifest = read_manifest(directory)
        if manifest and manifest.get("coordinates") == coordinates:
            try:
                jars = delta_jars(directory)
            except DeltaJarsNotSetUp:
                pass
            else:
                log.info("Delta jars already set up in %s (%d jars)", directory, len(jars))
                return jars

    directory.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="feedapi-dagster-jars-") as tmp:
        work = Path(tmp)
        resolved, used = resolve_jars(coordinates, EXCLUDED, work, resolver)
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
        try:
            manifest = _stage(resolved, coordinates, used, staging)
            _replace_dir(staging, directory)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    jars = delta_jars(directory)
    log.info(
        "Delta jars set up in %s with %s: kept %d, dropped %d already shipped by pyspark",
        directory,
        used,
        len(jars),
        len(manifest["dropped"]),
    )
    return jars


# --------------------------------------------------------------------------------------------
# filtering and staging


def _class_entries(jar: Path) -> set[str]:
    with zipfile.ZipFile(jar) as zf:
        return {
            n
            for n in zf.namelist()
            if n.endswith(".class") and not n.startswith("META-INF/") and not n.endswith("module-info.class")
        }


def _pyspark_classes(jars: Iterable[Path]) -> set[str]:
    classes: set[str] = set()
    for jar in jars:
        try:
            classes |= _class_entries(jar)
        except (OSError, zipfile.BadZipFile):
            continue
    return classes


def _stage(resolved: list[ResolvedJar], coordinates: list[str], resolver: str, staging: Path) -> dict:
    shipped = _pyspark_artifact_versions()
    kept: list[dict] = []
    dropped: list[dict] = []
    candidates: list[ResolvedJar] = []
    for jar in resolved:
        if jar.artifact in shipped:
            dropped.append(
                {
                    "group": jar.group,
                    "artifact": jar.artifact,
                    "version": jar.version,
                    "reason": f"pyspark ships {jar.artifact} {shipped[jar.artifact]}",
                }
            )
        else:
            candidates.append(jar)

    spark_classes = _pyspark_classes(pyspark_jars_dir().glob("*.jar")) if candidates else set()
    for jar in candidates:
        classes = _class_entries(jar.path)
        shadowed = len(classes & spark_classes)
        if classes and shadowed == len(classes):
            dropped.append(
                {
                    "group": jar.group,
                    "artifact": jar.artifact,
                    "version": jar.version,
                    "reason": "every class is already in pyspark/jars",
                }
            )
            continue
        file_name = f"{jar.artifact}-{jar.version}.jar"
        shutil.copy2(jar.path, staging / file_name)
        entry: dict[str, str | int] = {
            "group": jar.group,
            "artifact": jar.artifact,
            "version": jar.version,
            "file": file_name,
            "sha256": hashlib.sha256((staging / file_name).read_bytes()).hexdigest(),
        }
        if shadowed:
            entry["classes_also_in_pyspark"] = shadowed
        kept.append(entry)

    if not any(e["artifact"].startswith("delta-spark") for e in kept):
        raise DeltaJarsError(f"resolution did not yield delta-spark (kept: {[e['file'] for e in kept]})")
    import pyspark

    manifest = {
        "format": MANIFEST_FORMAT,
        "delta_version": DELTA_VERSION,
        "scala_binary_version": SCALA_BINARY_VERSION,
        "pyspark_version": pyspark.__version__,
        "coordinates": coordinates,
        "delta_connect_server": DELTA_CONNECT_SERVER_COORDINATE,
        "resolver": resolver,
        "jars": kept,
        "dropped": sorted(dropped, key=lambda d: (d["group"], d["artifact"])),
    }
    (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _replace_dir(staging: Path, target: Path) -> None:
    """Swap the staged folder in; the manifest is inside, so a half-done set-up is never visible."""
    os.chmod(staging, 0o755)
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
        os.replace(staging, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, target)
