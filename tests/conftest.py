"""Shared Spark fixtures: ONE classic local Spark session (with Delta) for the whole test run.

A JVM start costs ~10-15 s, so every test that needs Spark should take the `spark` fixture instead
of building its own session. Do not create Spark Connect sessions in the test process (pyspark
cannot mix classic and Connect sessions in one process): run Connect clients in a subprocess.
"""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def spark_work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Warehouse, Derby, Ivy and scratch dirs of the shared session."""
    return tmp_path_factory.mktemp("spark-work")


@pytest.fixture(scope="session")
def spark(spark_work_dir: Path):
    """The shared classic `local[*]` SparkSession with Delta (cached jars, no network)."""
    from feedapi_dagster.lakehouse.spark import local_spark_session

    session = local_spark_session(work_dir=spark_work_dir)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory):
    """One embedded Spark Connect server for the tests whose loads run in other processes (crash and
    chaos tests): those processes pay a ~3 s client instead of a ~15 s JVM each."""
    from feedapi_dagster.lakehouse.spark import find_free_port, start_embedded_server

    server = start_embedded_server(find_free_port(), work_dir=tmp_path_factory.mktemp("connect-server"))
    yield server
    server.stop()
