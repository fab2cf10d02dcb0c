"""`feedapi-dagster setup-jars`: the Delta and s3a jars resolved once into the cache, and the embedded
server's class archive trained on them (`spark/class_archive.py`), so that a server's first load
finds Spark's, Delta's and Parquet's classes already parsed and verified.

The training is a server of its own (a free port, a scratch work dir) started with
`-XX:ArchiveClassesAtExit`, given the warm-up's scratch loads in each payload form
(`warm_up.scratch_loads`: the code a run's load runs), and stopped: the JVM writes the classes it
loaded as it exits. The archive is written beside its final name and moved there, so a server that
starts meanwhile maps the old archive or the new one, never half of one.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from feedapi_dagster.errors import SparkError
from feedapi_dagster.lakehouse.payload_form import PayloadForm
from feedapi_dagster.orchestration.warm_up import scratch_loads
from feedapi_dagster.spark.class_archive import archive_path, dumping_options, remove_other_archives
from feedapi_dagster.spark.connect_server import SparkConnectServer
from feedapi_dagster.spark.jars import DeltaJarsError, jars_dir, setup_delta_jars
from feedapi_dagster.spark.settings import LOOPBACK

log = logging.getLogger(__name__)

# every class a load of each form uses is loaded by a few pages already; more events only take longer
TRAINING_EVENTS = 8_000
TRAINING_FORMS: tuple[PayloadForm, ...] = ("json", "variant", "columns")


class ClassArchiveFailed(SparkError):
    """The training server wrote no class archive (its log says why); servers start without one."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


def train_class_archive() -> Path:
    """The class archive for this JDK, pyspark and the Delta jars, trained anew (see the module
    docstring); `ClassArchiveFailed` when the JVM wrote none."""
    target = archive_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="feedapi-dagster-class-training-") as work:
        server = SparkConnectServer(
            _free_port(), work_dir=Path(work), java_options=dumping_options(scratch), class_archive=None
        )
        server.start()
        try:
            scratch_loads(server.port, Path(work) / "tables", TRAINING_FORMS, TRAINING_EVENTS)
        finally:
            server.stop()  # the JVM writes the archive as it exits
        if not scratch.is_file():
            raise ClassArchiveFailed(f"the training Spark server wrote no class archive to {scratch}")
    scratch.replace(target)
    remove_other_archives(target)
    log.info("the Spark server's class archive %s trained in %.1f s", target, time.monotonic() - began)
    return target


def _setup_jars(args: argparse.Namespace) -> int:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        jars = setup_delta_jars(force=args.force, resolver=args.resolver)
    except DeltaJarsError as exc:
        print(f"setup-jars failed: {exc}", file=sys.stderr)
        return 1
    print(f"{len(jars)} jars (Delta, s3a) in {jars_dir()}")
    archive = archive_path()
    if args.force or not archive.is_file():
        print("training the Spark server's class archive (a scratch load per payload form, about a minute)")
        try:
            archive = train_class_archive()
        except SparkError as exc:
            print(f"setup-jars: no class archive ({exc}); servers start without one", file=sys.stderr)
            return 1
    print(f"class archive {archive} ({archive.stat().st_size / 2**20:.0f} MB)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    setup = subparsers.add_parser(
        "setup-jars",
        help="resolve the Delta Lake jars once into the local cache (the only step that needs Maven) and train the "
        "Spark server's class archive on them",
    )
    setup.add_argument(
        "--force", action="store_true", help="resolve again and train again even if the cache is complete"
    )
    setup.add_argument(
        "--resolver",
        choices=("auto", "ivy", "maven"),
        default="auto",
        help="Spark's Ivy resolver, mvn, or Ivy then mvn (default)",
    )
    setup.set_defaults(func=_setup_jars)
