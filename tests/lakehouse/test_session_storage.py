"""The lakehouse's storage settings and credentials come with each session (issue 26): an embedded
Spark Connect server started without any ``s3a`` setting or AWS variable serves an ``s3a://`` lakehouse
whose settings and keys the run's session brings, with Hadoop's file system cache on (the default):
the server then keeps the file system of a bucket it opened, with its keys, until it restarts. With
``fresh_file_systems`` keys rotated between two runs, and another endpoint, are taken by the next run
without a server restart. The secret is in no log, shown setting, plan or error. Against S3 servers of
the tests (`tests/s3_server.py`), one of them checking every request's key (moto's IAM keys); each
client is a process of its own (a Connect session cannot live beside the tests' classic one), made as a
project's run makes it (`session_storage_client.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from feedapi_dagster.spark.embedded import start_embedded_server
from feedapi_dagster.spark.storage import S3Storage
from tests.conftest import TEST_SERVER_CONF
from tests.ports import find_free_port
from tests.s3_server import S3Server

ROOT = Path(__file__).resolve().parents[2]
CLIENT = Path(__file__).with_name("session_storage_client.py")
BUCKET = "keyed"
# what the AWS SDK of a JVM would find credentials in: none of it reaches the server of these tests
AWS_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
)


@pytest.fixture(scope="module")
def keyed_s3(tmp_path_factory):
    """An S3 server that refuses a key it does not know (or a revoked one), with the bucket `keyed`."""
    server = S3Server(log_path=tmp_path_factory.mktemp("keyed-s3") / "server.log", enforce_keys=True)
    server.create_bucket(BUCKET)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def bare_server(tmp_path_factory):
    """An embedded Spark Connect server with no s3a setting in its configuration and no AWS variable
    in its environment."""
    with pytest.MonkeyPatch.context() as patch:
        for name in AWS_VARIABLES:
            patch.delenv(name, raising=False)
        server = start_embedded_server(
            find_free_port(), work_dir=tmp_path_factory.mktemp("bare-server"), conf=TEST_SERVER_CONF
        )
    yield server
    server.stop()


def run(server, lakehouse: str, storage: S3Storage | None = None, env: dict[str, str] | None = None, **spec) -> dict:
    """One run's session on `server` (the client's process has `env` beside this one's, without AWS
    variables); what it printed, with its whole output under `output`."""
    spec = {
        "port": server.port,
        "lakehouse": lakehouse,
        "rows": 0,
        "storage": storage.model_dump_json() if storage else None,
        **spec,
    }
    environ = {k: v for k, v in os.environ.items() if k not in AWS_VARIABLES} | (env or {})
    process = subprocess.run(
        [sys.executable, str(CLIENT), json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=600,
        env=environ,
        cwd=ROOT,
    )
    assert process.returncode == 0, process.stdout[-2000:] + process.stderr[-4000:]
    outcome = json.loads(process.stdout.strip().splitlines()[-1])
    outcome["output"] = process.stdout + process.stderr
    return outcome


def assert_nowhere(secrets: list[str], *texts: str) -> None:
    for text in texts:
        for secret in secrets:
            assert secret not in text, f"a secret in: {text[:3000]}"


NO_CACHE = "fs.s3a.impl.disable.cache"


def no_cache_setting(outcome: dict) -> list[str]:
    """The lines of ``SET`` (as the client printed them) that set Hadoop's s3a file system cache."""
    return [line for line in outcome["set"] if line.startswith(f"{NO_CACHE}=")]


def test_without_the_opt_in_no_session_setting_turns_the_file_system_cache_off(monkeypatch):
    monkeypatch.setenv("LAKE_KEY", "k")
    monkeypatch.setenv("LAKE_SECRET", "s")
    for storage in (
        S3Storage(),
        S3Storage(
            endpoint="http://127.0.0.1:9000",
            path_style=True,
            region="x",
            access_key_id_env="LAKE_KEY",
            secret_access_key_env="LAKE_SECRET",
        ),
    ):
        assert not storage.fresh_file_systems and NO_CACHE not in storage.session_conf()
        assert storage.model_copy(update={"fresh_file_systems": True}).session_conf()[NO_CACHE] == "true"


def test_each_session_brings_its_storage_settings_and_keys_to_a_server_started_without_them(
    bare_server, keyed_s3, s3_server, tmp_path
):
    # the server's first session: a lakehouse on local disk
    local = run(bare_server, str(tmp_path / "lakehouse"), rows=2)
    assert local.get("count") == 2, local

    # the server's first S3 session, with the default storage (Hadoop's file system cache on)
    storage = S3Storage(
        endpoint=keyed_s3.url, path_style=True, access_key_id_env="LAKE_KEY", secret_access_key_env="LAKE_SECRET"
    )
    lakehouse = f"s3a://{BUCKET}/rotation"
    first_key, first_secret = keyed_s3.create_access_key()
    first = run(bare_server, lakehouse, storage, {"LAKE_KEY": first_key, "LAKE_SECRET": first_secret}, rows=3)
    assert first.get("count") == 3, first
    # Spark shows the keys' settings redacted, and the endpoint as it is; nothing turns the cache off
    assert f"fs.s3a.endpoint={keyed_s3.url}" in first["set"]
    shown = {line.split("=", 1)[0]: line.split("=", 1)[1] for line in first["set"]}
    assert {shown["fs.s3a.access.key"], shown["fs.s3a.secret.key"]} == {"*********(redacted)"}, shown
    assert first["set_secret"] == [["fs.s3a.secret.key", "*********(redacted)"]]
    assert no_cache_setting(first) == [], first["set"]

    # a variable named by *_env that is not set: the setting named, no session made
    unset = run(bare_server, lakehouse, storage, {"LAKE_KEY": first_key}, rows=1)
    assert unset["error"] == (
        "StorageError: lakehouse storage: environment variable LAKE_SECRET "
        "(storage.s3.secret_access_key_env) is not set in this process"
    ), unset

    # keys rotated: the first revoked, the variables hold the second. Without the opt-in the server
    # keeps the file system it opened the bucket with, the first key's: refused until it restarts
    second_key, second_secret = keyed_s3.create_access_key()
    keyed_s3.delete_access_key(first_key)
    second_keys = {"LAKE_KEY": second_key, "LAKE_SECRET": second_secret}
    stale = run(bare_server, f"s3a://{BUCKET}/stale", storage, second_keys, create=True)
    assert stale.get("error", "").startswith(
        f"StorageError: lakehouse table s3a://{BUCKET}/stale/events: S3 refused the credentials"
    ), stale

    # with fresh file systems (the opt-in) the same server, not restarted, takes the second key
    fresh = storage.model_copy(update={"fresh_file_systems": True})
    second = run(bare_server, lakehouse, fresh, second_keys, rows=2)
    assert second.get("count") == 5, second
    assert no_cache_setting(second) == [f"{NO_CACHE}=true"], second["set"]
    # ... and the first, revoked key no more
    revoked = run(
        bare_server, f"s3a://{BUCKET}/revoked", fresh, {"LAKE_KEY": first_key, "LAKE_SECRET": first_secret}, create=True
    )
    assert revoked.get("error", "").startswith(
        f"StorageError: lakehouse table s3a://{BUCKET}/revoked/events: S3 refused the credentials"
    ), revoked

    # another endpoint with a bucket of the same name (the other S3 server, which takes any key), then
    # back: one server, with the file system of the first endpoint and key still in Hadoop's cache
    s3_server.create_bucket(BUCKET)
    other_storage = S3Storage(
        endpoint=s3_server.url,
        path_style=True,
        access_key_id_env="LAKE_KEY",
        secret_access_key_env="LAKE_SECRET",
        fresh_file_systems=True,
    )
    other = run(
        bare_server,
        f"s3a://{BUCKET}/rotation-elsewhere",
        other_storage,
        {"LAKE_KEY": "feedapi-test-key", "LAKE_SECRET": "feedapi-test-secret"},
        rows=4,
    )
    assert other.get("count") == 4, other
    assert s3_server.keys(BUCKET, "rotation-elsewhere/")
    back = run(bare_server, lakehouse, fresh, second_keys, rows=1)
    assert back.get("count") == 6, back
    assert f"fs.s3a.endpoint={keyed_s3.url}" in back["set"]

    # a session without the opt-in after those: the setting they left in the shared server-side
    # session is unset (a bucket this server never opened with the cache on)
    cached = other_storage.model_copy(update={"fresh_file_systems": False})
    plain = run(
        bare_server,
        "s3a://lake/plain-after-fresh",
        cached,
        {"LAKE_KEY": "feedapi-test-key", "LAKE_SECRET": "feedapi-test-secret"},
        rows=1,
    )
    assert plain.get("count") == 1, plain
    assert no_cache_setting(plain) == [], plain["set"]

    # the secrets: in no client's output (their logs, SET, the plans, the errors) nor the server's log
    secrets = [first_secret, second_secret]
    for outcome in (first, unset, stale, second, revoked, other, back, plain):
        assert_nowhere(secrets, json.dumps(outcome))
    assert "Delta" in first["explain"] or "Relation" in first["explain"], first["explain"]
    assert_nowhere(secrets, bare_server.log_path.read_text(errors="replace"))
