"""`spark.failures` classifies Spark's failures by the error condition they really carry: a kept read
lost with its blocks, and a Delta commit that lost to another writer's, made for real in a classic
session and in a Spark Connect session (where they arrive as different Python types)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from feedapi_dagster.spark.failures import COMMIT_CONFLICTS, KEPT_BLOCK_LOST

from .spark_failures import classified

ROOT = Path(__file__).resolve().parents[2]


def _assert_classified(found: dict) -> None:
    assert found["kept"]["condition"] == KEPT_BLOCK_LOST, found
    assert found["kept"]["kept_read_lost"] and not found["kept"]["commit_conflict"], found
    assert found["raced"]["condition"] in COMMIT_CONFLICTS, found
    assert found["raced"]["commit_conflict"] and not found["raced"]["kept_read_lost"], found


def test_a_classic_sessions_failures_are_classified_by_their_condition(spark, tmp_path):
    # a classic session raises py4j's Py4JJavaError for both: the condition is its Java exception's
    found = classified(spark, tmp_path, Path(os.environ["SPARK_LOCAL_DIRS"]))
    assert found["kept"]["type"] == found["raced"]["type"] == "Py4JJavaError", found
    _assert_classified(found)


def test_a_spark_connect_sessions_failures_are_classified_by_their_condition(connect_server, tmp_path):
    env = {**os.environ, "FEEDAPI_TEST_CONNECT_URL": connect_server.client_url()}
    done = subprocess.run(
        [sys.executable, "-m", "tests.lakehouse.spark_failures", str(tmp_path), str(connect_server.work_dir / "tmp")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["kept"]["type"] == "SparkException", found
    _assert_classified(found)
