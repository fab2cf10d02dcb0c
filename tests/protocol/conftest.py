import json
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest

# A canned reply: (status, headers, body bytes)
Reply = tuple[int, dict[str, str], bytes]


class LocalServer:
    """A real HTTP server on 127.0.0.1; `handle(handler)` answers each GET however a test needs."""

    def __init__(self, handle: Callable[[BaseHTTPRequestHandler], None]):
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802
                handle(self)

            def log_message(self, *args):
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/feed"
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self._httpd.shutdown()
        self._httpd.server_close()


class ServedFeed(AbstractContextManager):
    """A test's own feed service on a `LocalServer`: `_handle(handler)` answers each GET; the server
    closes when the `with` block ends."""

    def __init__(self) -> None:
        self._server = LocalServer(self._handle)

    def __exit__(self, *exc: object) -> None:
        self._server.close()

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        raise NotImplementedError


class CannedServer(LocalServer):
    """Replies a test scripts, for documents no demo feed produces; records the requests."""

    def __init__(self, respond: Callable[[str, dict[str, list[str]], dict[str, str]], Reply]):
        self.requests: list[tuple[str, dict[str, list[str]], dict[str, str]]] = []
        super().__init__(self._answer)
        self._respond = respond

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(handler.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        headers = dict(handler.headers.items())
        self.requests.append((parts.path, query, headers))
        status, extra, body = self._respond(parts.path, query, headers)
        handler.send_response(status)
        for name, value in extra.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


def json_reply(document, status=200) -> Reply:
    return status, {"Content-Type": "application/json"}, json.dumps(document).encode()


@pytest.fixture
def canned():
    servers = []

    def start(respond):
        server = CannedServer(respond)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def pages_of(client, partition: int, cursor: str = "_first") -> list:
    """The pages `client.page_runs` reads, one by one."""
    return [page for run in client.page_runs(partition, cursor) for page in run.pages()]


def payloads(page) -> list:
    """A page's payloads decoded: dicts for object events, str for string events."""
    return [msgspec.json.decode(raw) for raw in page.raw_events]


def texts(page) -> list[str]:
    """A page's payloads as the demo feed publishes them: the JSON text as sent, a string payload's
    string decoded."""
    return [json.loads(raw) if raw.startswith(b'"') else raw.decode() for raw in page.raw_events]
