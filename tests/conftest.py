"""Shared fixtures: ONE classic local Spark session (with Delta) per pytest worker, the embedded Spark
Connect server, and the S3-compatible server with the lakehouses of the tests on S3.

A JVM start costs ~10-15 s, so every test that needs Spark should take the `spark` fixture instead
of building its own session. Do not create Spark Connect sessions in the test process (pyspark
cannot mix classic and Connect sessions in one process): run Connect clients in a subprocess.
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from feedapi_dagster.lakehouse.delta_log import DeltaLog
from feedapi_dagster.lakehouse.feed_table import FeedTable
from feedapi_dagster.spark.storage import S3Storage
from tests.s3_server import TEST_CREDENTIALS, S3Server

BUCKET = "lake"


@pytest.fixture(scope="session")
def spark_work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Warehouse, Derby, Ivy and scratch dirs of the shared session."""
    return tmp_path_factory.mktemp("spark-work")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    """The S3-compatible server of the test run (`tests/s3_server.py`, moto's, in its own process on
    127.0.0.1) with the bucket `lake`; its credentials are in this process's environment under the
    names the tests' storage setting gives (`s3_storage`)."""
    os.environ.update(TEST_CREDENTIALS)
    server = S3Server(log_path=tmp_path_factory.mktemp("s3-server") / "server.log")
    server.create_bucket(BUCKET)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_storage(s3_server: S3Server) -> S3Storage:
    """The storage setting of a lakehouse on the test S3 server, as a user's defs.yaml gives it."""
    return S3Storage(
        endpoint=s3_server.url,
        path_style=True,
        access_key_id_env="FEEDAPI_TEST_S3_KEY",
        secret_access_key_env="FEEDAPI_TEST_S3_SECRET",
    )


@pytest.fixture(scope="session")
def spark(spark_work_dir: Path, s3_storage: S3Storage):
    """The shared classic `local[*]` SparkSession with Delta (cached jars, no network) and the test S3
    server's `s3a` settings and credentials as session settings (as every session of a project gets them)."""
    from feedapi_dagster.spark.sessions import local_spark_session

    session = local_spark_session(work_dir=spark_work_dir, storage=s3_storage)
    yield session
    session.stop()


# The Spark Connect servers the tests start themselves run C1 only, as local sessions do: the
# embedded server's default, C2 (for a server that lives for days), spent ~15 s more CPU on each
# server's start and first Delta job, on a suite that keeps both cores busy. Which JIT compiles a
# method changes nothing a test checks. (`spark.driver.extraJavaOptions` of a server's conf comes
# last on its command line: its flag wins.)
C1_ONLY = "-XX:TieredStopAtLevel=1"
TEST_SERVER_CONF = {"spark.driver.extraJavaOptions": C1_ONLY}


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory):
    """One embedded Spark Connect server for the tests whose loads run in other processes (crash and
    chaos tests): those processes pay a ~3 s client instead of a ~15 s JVM each. No `s3a` setting or
    credentials of its own: a load on S3 brings them with its session (`connect_session(url, storage=...)`)."""
    from feedapi_dagster.spark.embedded import start_embedded_server
    from tests.ports import find_free_port

    server = start_embedded_server(
        find_free_port(), work_dir=tmp_path_factory.mktemp("connect-server"), conf=TEST_SERVER_CONF
    )
    yield server
    server.stop()


@dataclass(frozen=True)
class Lakehouse:
    """Where a test's tables live, local disk or the S3 server, and what the tests do to the files
    there (list them, read one, age them as Delta's log cleanup sees them)."""

    root: str
    storage: S3Storage | None = None
    server: S3Server | None = None

    @property
    def on_s3(self) -> bool:
        return self.server is not None

    def table(self, name: str = "feed") -> str:
        return f"{self.root}/{name}"

    @property
    def storage_options(self) -> dict[str, str]:
        return self.storage.storage_options() if self.storage else {}

    def feed_table(self, spark, path: str, **kwargs) -> FeedTable:
        return FeedTable(spark, path, storage_options=self.storage_options, **kwargs)

    def log(self, path: str) -> DeltaLog:
        """The table's log as delta-rs reads it (`read_committed_state(lakehouse.log(path))`)."""
        return DeltaLog(path, self.storage_options)

    def _key(self, path: str) -> str:
        return path.split(f"s3a://{BUCKET}/", 1)[1]

    def names(self, folder: str) -> list[str]:
        """The names of the files directly in `folder`."""
        if not self.on_s3:
            return sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        prefix = self._key(folder).rstrip("/") + "/"
        return sorted({key[len(prefix) :] for key in self.server.keys(BUCKET, prefix) if "/" not in key[len(prefix) :]})

    def read(self, path: str) -> bytes:
        """The file's bytes; FileNotFoundError when there is none."""
        if not self.on_s3:
            return Path(path).read_bytes()
        try:
            return self.server.read(BUCKET, self._key(path))
        except self.server.client.exceptions.NoSuchKey:
            raise FileNotFoundError(path) from None

    def age(self, folder: str, names: list[str], seconds: float) -> None:
        """Moves the modification time of these files of `folder` back by `seconds`."""
        for name in names:
            if self.on_s3:
                assert self.server.age(BUCKET, f"{self._key(folder)}/{name}", seconds) >= 1
            else:
                file = Path(folder) / name
                aged = file.stat().st_mtime - seconds
                os.utime(file, (aged, aged))


@pytest.fixture
def lakehouse(request, tmp_path) -> Lakehouse:
    """Local disk (default), or the S3 server with `@pytest.mark.parametrize("lakehouse", ["s3"], indirect=True)`:
    a fresh prefix of the bucket per test."""
    if getattr(request, "param", "local") == "local":
        return Lakehouse(str(tmp_path / "lakehouse"))
    return s3_lakehouse(request)


def s3_lakehouse(request) -> Lakehouse:
    """A fresh prefix of the test S3 server's bucket for the test asking."""
    prefix = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:60]  # no glob characters in a path
    return Lakehouse(
        f"s3a://{BUCKET}/{prefix}-{uuid.uuid4().hex[:8]}",
        request.getfixturevalue("s3_storage"),
        request.getfixturevalue("s3_server"),
    )


# `make test` hands whole files to its two pytest-xdist workers (`--dist loadfile`) in the order of
# the items below (`--no-loadscope-reorder`; xdist's default order, by number of tests, put the
# longest files, which hold one or two tests each, last, and the run ended on one worker while the
# other had nothing left). The longest files first, longest first (seconds in a CI run, for the order
# only); every other file after them, in collection order. A new long file goes in this list.
LONGEST_FILES = {
    "tests/lakehouse/test_crash.py": 290,
    "tests/orchestration/test_killed_stream_run.py": 260,
    "tests/lakehouse/test_killed_load_work.py": 110,
    "tests/cluster/test_standalone_cluster.py": 220,
    "tests/lakehouse/test_stream_source.py": 210,
    "tests/lakehouse/test_durable_state.py": 200,
    "tests/packaging/test_wheel.py": 190,
    "tests/docs/test_doc_blocks.py": 150,
    "tests/orchestration/test_flow.py": 150,
    "tests/lakehouse/test_layout.py": 140,
    "tests/chaos/test_chaos_nakadi.py": 130,
    "tests/orchestration/test_daemon.py": 125,
    "tests/lakehouse/test_feed_stream.py": 100,
    "tests/orchestration/test_stalled_loads.py": 100,
    "tests/browser/test_dagster_ui.py": 95,
    "tests/lakehouse/test_typed_columns.py": 90,
    "tests/orchestration/test_nakadi_flow.py": 80,
    "tests/orchestration/test_dev_command.py": 75,
    "tests/chaos/test_chaos_short.py": 70,
    "tests/lakehouse/test_session_storage.py": 70,
    "tests/lakehouse/test_progress.py": 65,
    "tests/lakehouse/test_spark.py": 60,
    "tests/lakehouse/test_maintenance.py": 50,
    "tests/orchestration/test_payload_columns.py": 45,
    "tests/orchestration/test_postgres_instance.py": 40,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: n for n, path in enumerate(sorted(LONGEST_FILES, key=LONGEST_FILES.__getitem__, reverse=True))}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: a file stays whole
