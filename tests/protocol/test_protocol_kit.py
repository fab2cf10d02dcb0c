"""docs/protocols/adding-a-protocol.md runs as written: its protocol module is written into a package
of its own (in a temporary folder), its `definitions.py` line imports it, its defs.yaml's feed is
validated as a project's, `FeedClient` reads a small audit-log server on 127.0.0.1 with it (pages,
cursors, `caught_up`, a refusal), and a load in another process sends the package to the test run's
Spark Connect server (whose workers cannot import it) and commits the events to Delta."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from feedapi_dagster.protocol import FeedClient, ProtocolError, registry
from feedapi_dagster.spark.connect_server import SparkConnectServer

from .conftest import ServedFeed

PAGE = Path(__file__).parents[2] / "docs" / "protocols" / "adding-a-protocol.md"
MODULE_PATH = "my_protocols/auditlog.py"
LIMIT = 4

LOAD = textwrap.dedent("""
    import json, sys
    projects, definitions, spark_settings, feed_values, table = sys.argv[1:6]
    sys.path.insert(0, projects)  # the user's package: on this process's path only
    exec(definitions)  # the page's definitions.py line: registers "auditlog"
    from feedapi_dagster.lakehouse.feed_table import FeedTable
    from feedapi_dagster.lakehouse.loader import FeedLoader
    from feedapi_dagster.spark.sessions import spark_session
    from feedapi_dagster.lakehouse.sink import DeltaSink
    from feedapi_dagster.spark.settings import SparkSettings
    from feedapi_dagster.protocol import feed_settings

    spark = spark_session(SparkSettings.model_validate_json(spark_settings))
    feed = feed_settings(json.loads(feed_values))
    reports = FeedLoader(feed, DeltaSink(FeedTable(spark, table))).sync()
    rows = spark.read.format("delta").load(table).orderBy("partition_id", "position").collect()
    print(json.dumps({
        "reports": {p: [r.events, r.cursor] for p, r in reports.items()},
        "rows": [[row.partition_id, json.loads(row.payload)["id"], row.cursor] for row in rows],
    }))
""")


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", PAGE.read_text(), flags=re.M | re.S)


class AuditLogServer(ServedFeed):
    """The page's audit-log service on 127.0.0.1: `logs[log][partition]` are the events."""

    def __init__(self, logs: dict[str, dict[int, list[dict]]]):
        self.logs = logs
        self.offsets: list[str] = []  # the `offset` of each fetch
        super().__init__()
        self.url = self._server.url.removesuffix("/feed")

    def _handle(self, handler) -> None:
        parts = urlsplit(handler.path)
        query = {key: values[0] for key, values in parse_qs(parts.query).items()}
        found = re.fullmatch(r"/logs/([^/]+)/partitions(?:/(\d+)/events)?", parts.path)
        log = self.logs.get(found.group(1)) if found else None
        if log is None:
            status, document = 404, {"error": f"no log at {parts.path}"}
        elif found.group(2) is None:
            status, document = 200, {"partitions": [{"id": partition} for partition in log]}
        else:
            self.offsets.append(query["offset"])
            events = log[int(found.group(2))]
            offset, limit = int(query["offset"]), int(query["limit"])
            status, document = 200, {"events": events[offset : offset + limit], "more": offset + limit < len(events)}
        body = json.dumps(document).encode()
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The page's module in a package of a temporary folder, on this process's path and registered
    for this test only (the registry and the modules are the process's)."""
    module, definitions = code_blocks("python")  # a block added to the page must be run here too
    assert module.startswith(f"# {MODULE_PATH}\n")
    (tmp_path / "my_protocols").mkdir()
    (tmp_path / "my_protocols" / "__init__.py").write_text("")
    (tmp_path / MODULE_PATH).write_text(module)
    monkeypatch.setattr(registry, "_PROTOCOLS", dict(registry._PROTOCOLS))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path, definitions
    for name in [name for name in sys.modules if name.partition(".")[0] == "my_protocols"]:
        del sys.modules[name]


def test_the_pages_protocol_reads_its_server_and_loads_it_through_spark_connect(
    project, connect_server: SparkConnectServer, tmp_path: Path
) -> None:
    from feedapi_dagster.orchestration import FeedConfig

    root, definitions = project
    # written against what `feedapi_dagster.protocol` exports, and nothing else of the package
    imported = re.findall(r"^(?:from|import) (feedapi_dagster\S*)", (root / MODULE_PATH).read_text(), flags=re.M)
    assert imported == ["feedapi_dagster.protocol"]
    exec(definitions, {})
    (defs_yaml,) = code_blocks("yaml")
    (entry,) = yaml.safe_load(defs_yaml)["attributes"]["feeds"]
    events = {p: [{"id": f"{p}-{n}", "n": n} for n in range(count)] for p, count in ((0, 10), (1, 3))}
    with AuditLogServer({"payments": events}) as server:
        entry = {**entry, "url": server.url, "token": None, "page_size_hint": LIMIT}
        feed = FeedConfig.model_validate(entry).settings
        assert type(feed).__name__ == "AuditLogSettings" and feed.log == "payments"

        client = FeedClient(feed)
        assert [p.id for p in client.discover().partitions] == [0, 1]
        runs = list(client.page_runs(0))
        assert [json.loads(raw) for run in runs for raw in run.raw_events] == events[0]
        assert [run.cursor for run in runs] == ["4", "8", "10"]
        assert server.offsets == ["0", "4", "8"]  # the last answer said `more: false`: no fetch after it
        assert list(client.page_runs(0, "10")) == [] and server.offsets[-1] == "10"
        missing = FeedClient(feed.model_copy(update={"log": "nope"}))
        with pytest.raises(ProtocolError, match=r"partition listing failed \(HTTP 404\): no log at /logs/nope/"):
            missing.discover()

        embedded = {"mode": "embedded", "port": connect_server.port}
        settings = json.dumps(feed.model_dump(mode="json", exclude={"token"}))
        table = tmp_path / "lakehouse" / "audit"
        proc = subprocess.run(
            [sys.executable, "-c", LOAD, str(root), definitions, json.dumps(embedded), settings, str(table)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded["reports"] == {"0": [10, "10"], "1": [3, "3"]}
    # each row with its page's cursor: the offset after the page
    pages = [
        [p, event["id"], str(min((n // LIMIT + 1) * LIMIT, len(events[p])))]
        for p in events
        for n, event in enumerate(events[p])
    ]
    assert loaded["rows"] == pages


def test_a_protocol_is_checked_against_the_interface_when_it_is_registered() -> None:
    """A protocol written against the previous `reader()` (no `max_page_bytes`) is refused when it is
    registered, naming the method and the parameters it must take; one lacking a method cannot be made."""
    from tests.protocol.third_protocol import JsonLines

    class OldReader(JsonLines):
        def reader(self, feed, info, partition_id, cursor):  # type: ignore[override]
            raise AssertionError("never called")

    with pytest.raises(ProtocolError) as refused:
        registry.register_protocol(OldReader())
    assert str(refused.value) == (
        "protocol 'jsonlines': OldReader.reader(self, feed, info, partition_id, cursor) does not take the "
        "interface's parameters: reader(self, feed, info, partition_id, cursor, max_page_bytes)"
    )
    assert registry.registered_protocols().get("jsonlines") is not OldReader

    from feedapi_dagster.protocol.interface import FeedProtocol

    class NoFetch(FeedProtocol):
        name = "nofetch"

        def discovery_request(self, feed):
            return None

        def discovered(self, feed, response):
            raise AssertionError

        def reader(self, feed, info, partition_id, cursor, max_page_bytes):
            raise AssertionError

    with pytest.raises(TypeError, match="Can't instantiate abstract class NoFetch with abstract method fetch"):
        NoFetch()  # type: ignore[abstract]
