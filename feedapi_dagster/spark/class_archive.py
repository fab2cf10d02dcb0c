"""The embedded server's class archive: the JVM's class data sharing (CDS) for the classes a load uses.

A new server's first load used to spend much of its time loading and verifying the classes of Spark
SQL, Delta, Parquet and Spark Connect, one jar entry at a time. `feedapi-dagster setup-jars` records
them once, in this installation (`archive_dir`) (`orchestration.warm_up.train_class_archive`: a training server started with
`-XX:ArchiveClassesAtExit`, scratch loads in each payload form, then stopped, which is when the JVM
writes the archive), and every embedded server maps them at start (`-XX:SharedArchiveFile`), already
parsed and verified. The JIT's work is not archived by Java 17: the server still compiles its hot paths
in its first minutes.

The archive is the JVM's own format and the JVM checks it: an archive of another JDK, or of a class
path whose jars changed, is refused with a line in the server's log and the server runs as without
one. So that this never happens silently after an upgrade, the archive's name carries what it was made
with (the `java` that runs the server, the pyspark installation and its version, the jars' folder and
their coordinates): an archive for another of those is not used, and `setup-jars` makes a new one. CDS archives only the classes of the
JVM's own class path, not those a class loader of Spark's adds (`spark.jars`): the server gets the
Delta jars on its class path (`spark.driver.extraClassPath`) instead.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
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


def archive_dir() -> Path:
    """This installation's folder of class archives (beside its pyspark, not in the jars' cache, which
    several virtualenvs may share: `FEEDAPI_DAGSTER_JARS_DIR`)."""
    return Path(sys.prefix) / "share" / "feedapi-dagster" / "class-archive"


def archive_path() -> Path:
    """Where the class archive for this JDK, pyspark and the Delta jars is (it may not exist)."""
    from pyspark.version import __version__

    made_with = [_java(), str(pyspark_home()), __version__, str(jars_dir()), *delta_coordinates()]
    return archive_dir() / f"{ARCHIVE_PREFIX}{_key(chr(10).join(made_with))}.jsa"


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
    """Remove the archives of earlier JDKs, pyspark versions or jars beside `keep` (each is ~200 MB)."""
    for found in keep.parent.glob(f"{ARCHIVE_PREFIX}*.jsa"):
        if found != keep:
            found.unlink(missing_ok=True)
