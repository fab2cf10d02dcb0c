"""`feedapi-dagster state` where it cannot read a table, as a user meets it: one line and exit code
1. A path without a table says so without starting Spark (Spark's temp folder is never made); a
table neither delta-rs nor Spark can open says why in Spark's words, its log in a file."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from tests.conftest import BUCKET
from tests.ports import find_free_port
from tests.s3_server import TEST_CREDENTIALS


def state_command(table: str, temp: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    temp.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "feedapi_dagster.cli", "state", table],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(temp), **(env or {})},
    )


def test_state_of_a_folder_without_a_table_is_one_line_without_spark(tmp_path: Path) -> None:
    empty = tmp_path / "lakehouse" / "orders"
    empty.mkdir(parents=True)
    for table, reason in (
        (str(empty), "no Delta table here (no _delta_log with commits under it)"),
        (str(tmp_path / "lakehouse" / "ordres"), "no such folder"),
    ):
        done = state_command(table, tmp_path / "tmp")
        assert (done.returncode, done.stdout, done.stderr) == (1, "", f"{table}: {reason}\n")
    assert list((tmp_path / "tmp").iterdir()) == []  # a Spark session would have made its work dir here


def test_state_of_an_s3_prefix_without_a_table_is_one_line_without_spark(tmp_path: Path, s3_server) -> None:
    table = f"s3a://{BUCKET}/{uuid.uuid4().hex}/orders"
    # the AWS variables delta-rs reads, as a user of the command sets them
    env = {
        "AWS_ENDPOINT_URL": s3_server.url,
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "AWS_ACCESS_KEY_ID": TEST_CREDENTIALS["FEEDAPI_TEST_S3_KEY"],
        "AWS_SECRET_ACCESS_KEY": TEST_CREDENTIALS["FEEDAPI_TEST_S3_SECRET"],
    }
    done = state_command(table, tmp_path / "tmp", env)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"{table}: no Delta table here (no _delta_log with commits under it)\n"
    assert list((tmp_path / "tmp").iterdir()) == []


def test_state_of_an_s3_table_spark_cannot_read_is_one_line_naming_what_to_set(tmp_path: Path) -> None:
    # no credentials, no server: delta-rs cannot open it, and neither can the Spark the command falls back on
    table = f"s3a://{BUCKET}/orders"
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{find_free_port()}",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
    }
    done = state_command(table, tmp_path / "tmp", env)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith(
        f"{table}: Spark cannot read it: lakehouse table {table}: no AWS credentials: set "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    ), done.stderr[-3000:]
    assert done.stderr.endswith(f"(Spark's log: {tmp_path / 'tmp' / 'feedapi-dagster-state-spark.log'})\n")
    assert done.stderr.count("\n") == 1  # the JVM's warnings and stack traces are in its log
