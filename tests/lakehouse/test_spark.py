"""Delta jar cache and Spark sessions: local (shared `spark` fixture) and the embedded Connect server.

JVM budget: the shared local session (conftest) plus ONE embedded Connect server for this module.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from feedapi_dagster.spark.class_archive import archive_path, sharing_options
from feedapi_dagster.spark.connect_server import SparkConnectServer, port_open, read_token
from feedapi_dagster.spark.embedded import ensure_embedded_server
from feedapi_dagster.spark.jars import (
    DELTA_SPARK_COORDINATE,
    DELTA_VERSION,
    delta_jars,
    name_version_splits,
    pyspark_jars_dir,
    read_manifest,
)
from feedapi_dagster.spark.server_record import process_group
from feedapi_dagster.spark.settings import SparkSettings, installation_port
from tests.conftest import TEST_SERVER_CONF
from tests.ports import find_free_port

# Java-level proxies that lead nowhere: any HTTP(S) download attempted by the JVM (Ivy) would fail.
NO_NETWORK_JAVA_OPTIONS = [
    "-Dhttp.proxyHost=10.255.255.1",
    "-Dhttp.proxyPort=9",
    "-Dhttps.proxyHost=10.255.255.1",
    "-Dhttps.proxyPort=9",
]


def test_cached_jars_are_complete_and_do_not_duplicate_pyspark_jars() -> None:
    jars = delta_jars()
    assert jars and all(p.is_file() and p.suffix == ".jar" for p in jars)
    manifest = read_manifest()
    assert manifest["delta_version"] == DELTA_VERSION
    assert DELTA_SPARK_COORDINATE in manifest["coordinates"]
    artifacts = {entry["artifact"] for entry in manifest["jars"]}
    assert {"delta-spark_2.13", "delta-storage"} <= artifacts

    shipped = {name for jar in pyspark_jars_dir().glob("*.jar") for name, _ in name_version_splits(jar.name)}
    duplicates = sorted(artifacts & shipped)
    assert not duplicates, f"jars that pyspark already ships: {duplicates}"
    assert {"jackson-core", "jackson-databind", "parquet-hadoop"} <= {d["artifact"] for d in manifest["dropped"]}


def test_settings_validation() -> None:
    assert SparkSettings().mode == "embedded" and SparkSettings().port == installation_port()
    assert SparkSettings(mode="remote", remote="sc://spark:15002").remote == "sc://spark:15002"
    assert SparkSettings(mode="local", conf={"spark.sql.shuffle.partitions": 2}).conf == {
        "spark.sql.shuffle.partitions": "2"
    }
    with pytest.raises(ValidationError, match="needs `remote`"):
        SparkSettings(mode="remote")
    with pytest.raises(ValidationError, match="must be a Spark Connect URL starting with sc://"):
        SparkSettings(mode="remote", remote="http://spark:15002")
    with pytest.raises(ValidationError, match="only used with mode 'remote'"):
        SparkSettings(remote="sc://spark:15002")
    with pytest.raises(ValidationError):
        SparkSettings(port=0)


@pytest.mark.spark
def test_local_session_delta_roundtrip_without_package_resolution(spark, spark_work_dir: Path, tmp_path: Path) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.jars.packages", None) is None
    assert conf.get("spark.jars").split(",") == [str(p) for p in delta_jars()]
    assert spark.conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"

    table = str(tmp_path / "events")
    spark.range(5).selectExpr("id", "id * 2 AS doubled").write.format("delta").save(table)
    spark.sql(f"INSERT INTO delta.`{table}` VALUES (5, 10)")
    rows = spark.read.format("delta").load(table).orderBy("id").collect()
    assert [(r.id, r.doubled) for r in rows] == [(i, 2 * i) for i in range(6)]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").orderBy("version").collect()
    assert [(h.version, h.operation) for h in history] == [(0, "WRITE"), (1, "WRITE")]

    # nothing was resolved: the session's private Ivy home is still empty
    assert not any((spark_work_dir / "ivy").iterdir())


# --------------------------------------------------------------------------------------------
# embedded Spark Connect server: one start for the module


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory):
    work_dir = tmp_path_factory.mktemp("connect-server")
    server = SparkConnectServer(
        find_free_port(), work_dir=work_dir, conf=TEST_SERVER_CONF, java_options=NO_NETWORK_JAVA_OPTIONS
    )
    with server:
        yield server


CLIENT = textwrap.dedent("""
    import json, sys, time
    started = time.monotonic()
    from feedapi_dagster.spark.sessions import spark_session
    from feedapi_dagster.spark.settings import SparkSettings
    from pyspark.sql import functions as F
    # embedded mode: finds the server already listening on the port and only connects a client
    spark = spark_session(SparkSettings(mode="embedded", port=int(sys.argv[1])))
    connected = time.monotonic()
    spark.range(1).collect()
    first_action = time.monotonic()
    table = sys.argv[2]
    spark.range(4).withColumn("doubled", F.col("id") * 2).write.format("delta").save(table)
    spark.sql(f"INSERT INTO delta.`{table}` VALUES (4, 8)")
    rows = [tuple(r) for r in spark.read.format("delta").load(table).orderBy("id").collect()]
    history = [(h.version, h.operation) for h in spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()]
    print(json.dumps({"rows": rows, "history": sorted(history), "type": type(spark).__module__,
                      "connect_s": connected - started, "first_action_s": first_action - started}))
""")


@pytest.mark.spark
def test_connect_client_writes_and_reads_delta(connect_server: SparkConnectServer, tmp_path: Path) -> None:
    table = tmp_path / "events"
    proc = subprocess.run(
        [sys.executable, "-c", CLIENT, str(connect_server.port), str(table)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["type"].startswith("pyspark.sql.connect")
    assert result["rows"] == [[i, 2 * i] for i in range(5)]
    assert result["history"] == [[0, "WRITE"], [1, "WRITE"]]
    assert (table / "_delta_log" / "00000000000000000001.json").is_file()
    # nothing was resolved by the server either
    assert not any((connect_server.work_dir / "ivy").iterdir())
    print(f"connect client: session {result['connect_s']:.2f} s, first action {result['first_action_s']:.2f} s")


REMOTE_WITH_TOKEN = textwrap.dedent("""
    import sys
    from feedapi_dagster.spark.sessions import spark_session
    from feedapi_dagster.spark.settings import SparkSettings
    spark_session(SparkSettings(mode="remote", remote=sys.argv[1]), unresponsive_seconds=8).range(1).collect()
""")


@pytest.mark.spark
def test_a_token_for_a_server_without_tls_is_refused_at_once(connect_server: SparkConnectServer) -> None:
    """The deployment guide's `SPARK_CONNECT_AUTHENTICATE_TOKEN` beside a URL without `use_ssl=true`:
    pyspark speaks TLS to a server that does not (it retried for 14 minutes, a bounded client would
    call the server unresponsive); the run says what to change, before any call, and never the token."""
    token = read_token(connect_server.port)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", REMOTE_WITH_TOKEN, f"sc://127.0.0.1:{connect_server.port}"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SPARK_CONNECT_AUTHENTICATE_TOKEN": token},
    )
    elapsed = time.monotonic() - started
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("feedapi_dagster.errors.SparkError: the Spark Connect server at sc://127.0.0.1:"), last
    assert "is sent over TLS only, and the URL has no `;use_ssl=true`" in last, last
    assert token not in proc.stderr
    assert elapsed < 8, f"refused after {elapsed:.1f} s: not before the first call"
    # the same server reached as `localhost` with the token takes it (gRPC's local credentials)
    proc = subprocess.run(
        [sys.executable, "-c", REMOTE_WITH_TOKEN, f"sc://localhost:{connect_server.port}"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SPARK_CONNECT_AUTHENTICATE_TOKEN": token},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _listening_addresses(pid: int) -> list[ipaddress._BaseAddress]:
    """Local addresses of the TCP sockets the process listens on (Linux /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    addresses = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                raw = bytes.fromhex(fields[1].split(":")[0])
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                addresses.append(ipaddress.ip_address(raw))
    return addresses


@pytest.mark.spark
@pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="needs Linux /proc")
def test_server_listens_on_loopback_only_and_is_reused(connect_server: SparkConnectServer) -> None:
    addresses = _listening_addresses(connect_server.pid)
    assert addresses, "the server has no listening socket"
    for address in addresses:
        mapped = getattr(address, "ipv4_mapped", None)
        assert address.is_loopback or (mapped is not None and mapped.is_loopback), addresses

    reused = ensure_embedded_server(connect_server.port)
    assert reused.url == connect_server.url and not reused.owned
    reused.stop()  # not ours: a no-op
    assert connect_server.is_running()


REMOTE_CLIENT = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    try:
        SparkSession.builder.remote(sys.argv[1]).getOrCreate().range(3).collect()
    except Exception as error:
        print("refused:", type(error).__name__, str(error).splitlines()[0][:300])
        sys.exit(3)
    print("accepted")
""")


@pytest.mark.spark
def test_a_client_without_the_servers_token_is_refused(connect_server: SparkConnectServer) -> None:
    """The server runs Python for its clients: only those holding its token (a 0600 file) get in."""
    from feedapi_dagster.spark.connect_server import token_file

    port = connect_server.port
    assert token_file(port).stat().st_mode & 0o777 == 0o600
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_AUTHENTICATE_TOKEN"}
    outcomes = {}
    for name, url in {
        "no token": f"sc://127.0.0.1:{port}",
        "wrong token": f"sc://localhost:{port}/;token=wrong",
        "the server's token": connect_server.client_url(),
    }.items():
        proc = subprocess.run(
            [sys.executable, "-c", REMOTE_CLIENT, url], capture_output=True, text=True, timeout=120, env=env
        )
        outcomes[name] = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
    assert outcomes["no token"].startswith("refused"), outcomes
    assert outcomes["wrong token"].startswith("refused"), outcomes
    assert outcomes["the server's token"] == "accepted", outcomes


@pytest.mark.spark
def test_the_server_maps_the_class_archive_setup_jars_trained(connect_server: SparkConnectServer) -> None:
    """`make setup` ran `setup-jars`, which trained the archive for this JDK, pyspark and jars: the
    server's JVM maps it (its memory map names the file), and its log line says so."""
    archive = archive_path()
    assert archive.is_file(), f"no class archive at {archive}: `feedapi-dagster setup-jars` trains it"
    assert connect_server.pid is not None
    jvms = [pid for pid in process_group(connect_server.pid) if "java" in Path(f"/proc/{pid}/exe").resolve().name]
    assert jvms, process_group(connect_server.pid)
    mapped = [pid for pid in jvms if str(archive) in Path(f"/proc/{pid}/maps").read_text()]
    assert mapped, f"the server's JVM {jvms} does not map {archive}"
    # an archive of another JDK, pyspark or jars is a file of another name: never handed to the JVM
    assert sharing_options(archive.with_name("spark-server-classes-other.jsa")) == []


@pytest.mark.spark
def test_stop_leaves_no_process_behind(connect_server: SparkConnectServer) -> None:
    """Runs last in this module: it stops the shared server."""
    pid = connect_server.pid
    connect_server.stop()
    assert not connect_server.is_running()
    left = subprocess.run(["ps", "-o", "pid,ppid,stat,cmd", "-g", str(pid)], capture_output=True, text=True).stdout
    assert pid is not None and not process_group(pid), f"left in the server's process group:\n{left}"
    deadline = time.monotonic() + 5
    while port_open(connect_server.port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not port_open(connect_server.port)
    connect_server.stop()  # idempotent
