"""The embedded server's class archive: the JVM's class data sharing (CDS) for the classes a load uses.

A new server's first load used to spend much of its time loading and verifying the classes of Spark
SQL, Delta, Parquet and Spark Connect, one jar entry at a time. `feedapi-dagster setup-jars` records
them once (`orchestration.warm_up.train_class_archive`: a training server started with
`-XX:ArchiveClassesAtExit`, scratch loads in each payload form, then stopped, which is when the JVM
writes the archive), and every embedded server maps them at start (`-XX:SharedArchiveFile`), already
parsed and verified. The JIT's work is not archived by Java 17: the server still compiles its hot paths
in its first minutes.

The archive is the JVM's own format and the JVM checks it: an archive of another JDK, or of a class
path whose jars changed, is refused with a line in the server's log and the server runs as without
one. So that this never happens silently after an upgrade, the archive's name carries what it was made
with (the pyspark installation and its version, the `java` that runs the server, the Delta jars'
coordinates): an archive for another of those is not used, and `setup-jars` makes a new one. CDS archives only the classes of the
JVM's own class path, not those a class loader of Spark's adds (`spark.jars`): the server gets the
Delta jars on its class path (`spark.driver.extraClassPath`) instead.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from feedapi_dagster.spark.jar_resolution import pyspark_home
from feedapi_dagster.spark.jars import delta_coordinates, jars_dir

ARCHIVE_PREFIX = "spark-server-classes-"


def _java() -> str:
    """The `java` that spark-submit runs (`JAVA_HOME`'s, else the one on PATH), its real path."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return os.path.realpath(java) if java else "java"


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _pyspark_prefix() -> str:
    """The first part of an archive's name: the pyspark installation whose jars are the class path
    (two virtualenvs may share a jars cache, `FEEDAPI_DAGSTER_JARS_DIR`: each gets its archive)."""
    from pyspark.version import __version__

    return f"{ARCHIVE_PREFIX}{_key(f'{pyspark_home()}{os.pathsep}{__version__}')}-"


def archive_path(directory: Path | None = None) -> Path:
    """Where the class archive for this JDK, pyspark and the Delta jars is (it may not exist)."""
    return (directory or jars_dir()) / f"{_pyspark_prefix()}{_key(chr(10).join([_java(), *delta_coordinates()]))}.jsa"


def sharing_options(archive: Path | None) -> list[str]:
    """The server's JVM options that map `archive` (none when there is no such file)."""
    return [f"-XX:SharedArchiveFile={archive}"] if archive is not None and archive.is_file() else []


def dumping_options(target: Path) -> list[str]:
    """The JVM options of a training server: the classes it loaded written to `target` as it exits."""
    return [f"-XX:ArchiveClassesAtExit={target}"]


def class_path(jars: Sequence[Path]) -> str:
    """`spark.driver.extraClassPath` for `jars`: the same order for the training server and the others
    (the JVM takes an archive only for a class path that begins as the one it was made with)."""
    return os.pathsep.join(str(jar) for jar in jars)


def remove_other_archives(keep: Path) -> None:
    """Remove the archives of this pyspark's earlier JDKs or jars beside `keep` (each is ~200 MB)."""
    for found in keep.parent.glob(f"{_pyspark_prefix()}*.jsa"):
        if found != keep:
            found.unlink(missing_ok=True)
