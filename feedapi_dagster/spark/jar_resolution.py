"""Maven coordinates resolved into jar files: Spark's own Ivy resolver (``spark-submit --packages``
in a child process with a private Ivy home) or ``mvn dependency:copy-dependencies``. What to resolve,
and the cache the jars are kept in, are `jars`'.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from feedapi_dagster.errors import SparkError

log = logging.getLogger(__name__)

Resolver = Literal["auto", "ivy", "maven"]


class DeltaJarsError(SparkError):
    """Resolving or locating the Delta jars failed."""


@dataclass(frozen=True)
class ResolvedJar:
    group: str
    artifact: str
    version: str
    path: Path


def pyspark_home() -> Path:
    """The pip-installed pyspark distribution (it is a complete SPARK_HOME)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def name_version_splits(file_name: str) -> list[tuple[str, str]]:
    """Every way to read ``<artifact>-<version>.jar``: the version starts with a digit after a '-'.

    ``log4j-1.2-api-2.25.4.jar`` -> [("log4j", "1.2-api-2.25.4"), ("log4j-1.2-api", "2.25.4")]
    """
    stem = file_name[: -len(".jar")] if file_name.endswith(".jar") else file_name
    return [(stem[: m.start()], stem[m.start() + 1 :]) for m in re.finditer(r"-(?=\d)", stem)]


def resolve_jars(
    coordinates: list[str], excluded: tuple[str, ...], work: Path, resolver: Resolver
) -> tuple[list[ResolvedJar], str]:
    """The jars of `coordinates` and their dependencies but `excluded` (``group:artifact``), downloaded
    under `work`; and the resolver that found them (the first of `resolver`'s that succeeds)."""
    order = {"auto": ["ivy", "maven"], "ivy": ["ivy"], "maven": ["maven"]}[resolver]
    errors = []
    for name in order:
        log.info("Resolving %s with %s ...", ", ".join(coordinates), name)
        try:
            if name == "ivy":
                jars = _resolve_with_ivy(coordinates, excluded, work / "ivy")
            else:
                jars = _resolve_with_maven(coordinates, excluded, work / "maven")
        except DeltaJarsError as exc:
            log.warning("%s resolution failed: %s", name, exc)
            errors.append(f"{name}: {exc}")
            continue
        return jars, name
    raise DeltaJarsError("could not resolve the Delta jars:\n" + "\n".join(errors))


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None, log_path: Path, timeout: float) -> None:
    with open(log_path, "wb") as out:
        try:
            proc = subprocess.run(
                cmd,
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
            )
        except FileNotFoundError as exc:
            raise DeltaJarsError(f"cannot run {cmd[0]}: {exc}") from exc
        except subprocess.TimeoutExpired as exc:
            raise DeltaJarsError(f"{cmd[0]} timed out after {timeout:.0f} s; log tail:\n{log_tail(log_path)}") from exc
    if proc.returncode != 0:
        raise DeltaJarsError(f"{Path(cmd[0]).name} exited with {proc.returncode}; log tail:\n{log_tail(log_path)}")


def log_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a child process's log (what a failure message quotes)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _resolve_with_ivy(
    coordinates: list[str], excluded: tuple[str, ...], work: Path, timeout: float = 900
) -> list[ResolvedJar]:
    """spark-submit --packages with a private Ivy home and a no-op Python app."""
    work.mkdir(parents=True)
    ivy = work / "ivy-home"
    app = work / "noop.py"
    app.write_text("# resolution happens in spark-submit before this runs\n")
    home = pyspark_home()
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    env.update(SPARK_HOME=str(home), PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    cmd = [
        str(home / "bin" / "spark-submit"),
        "--master",
        "local[1]",
        "--conf",
        f"spark.jars.ivy={ivy}",
        "--conf",
        "spark.ui.enabled=false",
        "--packages",
        ",".join(coordinates),
        "--exclude-packages",
        ",".join(excluded),
        str(app),
    ]
    _run(cmd, cwd=work, env=env, log_path=work / "spark-submit.log", timeout=timeout)
    retrieved = sorted((ivy / "jars").glob("*.jar"))
    if not retrieved:
        raise DeltaJarsError(f"Ivy retrieved no jars; log tail:\n{log_tail(work / 'spark-submit.log')}")
    return [_parse_ivy_jar(p, ivy / "cache") for p in retrieved]


def _parse_ivy_jar(path: Path, cache: Path) -> ResolvedJar:
    """Ivy retrieves as ``<org>_<artifact>-<rev>.jar``; the cache tells where the artifact name ends."""
    group, _, rest = path.name.partition("_")
    stem = rest[: -len(".jar")]
    artifacts = [d.name for d in (cache / group).iterdir() if d.is_dir()] if (cache / group).is_dir() else []
    matches = [a for a in artifacts if stem.startswith(a + "-")]
    if matches:
        artifact = max(matches, key=len)
        return ResolvedJar(group, artifact, stem[len(artifact) + 1 :], path)
    splits = name_version_splits(rest)
    if not splits:
        raise DeltaJarsError(f"cannot parse the retrieved jar name {path.name}")
    artifact, version = splits[-1]
    return ResolvedJar(group, artifact, version, path)


def _resolve_with_maven(
    coordinates: list[str], excluded: tuple[str, ...], work: Path, timeout: float = 900
) -> list[ResolvedJar]:
    """``mvn dependency:copy-dependencies`` on a generated pom, repository layout kept."""
    work.mkdir(parents=True)
    exclusions = "".join(
        f"<exclusion><groupId>{exclusion.split(':')[0]}</groupId>"
        f"<artifactId>{exclusion.split(':')[1]}</artifactId></exclusion>"
        for exclusion in excluded
    )
    deps = []
    for coordinate in coordinates:
        group, artifact, version = coordinate.split(":")
        deps.append(
            f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version><exclusions>{exclusions}</exclusions></dependency>"
        )
    pom = textwrap.dedent("""\
        <project xmlns="http://maven.apache.org/POM/4.0.0">
          <modelVersion>4.0.0</modelVersion>
          <groupId>feedapi-dagster</groupId>
          <artifactId>delta-jars</artifactId>
          <version>0</version>
          <packaging>pom</packaging>
          <dependencies>
            {deps}
          </dependencies>
        </project>
        """).format(deps="\n    ".join(deps))
    (work / "pom.xml").write_text(pom)
    out = work / "out"
    cmd = [
        shutil.which("mvn") or "mvn",
        "-B",
        "-q",
        "-f",
        str(work / "pom.xml"),
        "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies",
        f"-DoutputDirectory={out}",
        "-Dmdep.useRepositoryLayout=true",
        "-DincludeScope=runtime",
    ]
    _run(cmd, cwd=work, env=None, log_path=work / "mvn.log", timeout=timeout)
    jars = []
    for path in sorted(out.rglob("*.jar")):
        parts = path.relative_to(out).parts  # group/as/dirs/artifact/version/file.jar
        if len(parts) < 4:
            raise DeltaJarsError(f"unexpected layout from maven: {path}")
        jars.append(ResolvedJar(".".join(parts[:-3]), parts[-3], parts[-2], path))
    if not jars:
        raise DeltaJarsError(f"maven copied no jars; log tail:\n{log_tail(work / 'mvn.log')}")
    return jars
