"""What the bundled demo servers share on HTTP: a threaded HTTP/1.1 server that really stops (its open
connections are shut down), the base of their request handlers (plain responses, the admin endpoint
routed to the server's admin actions), and `DemoServer`, a demo server's life in a thread with what
every demo server can be given (a token, faults, a gate)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import SplitResult, urlsplit

from feedapi_dagster.demo.admin import (
    AdminActions,
    fault_admin_actions,
    run_admin_action,
)
from feedapi_dagster.demo.faults import Faults
from feedapi_dagster.demo.gate import Gate


class DemoHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], demo: Any, handler: type[BaseHTTPRequestHandler]) -> None:
        self.demo = demo
        # open connections (keep-alive, streams), shut down on stop so that a stopped server really stops
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already gone


class DemoHandler(BaseHTTPRequestHandler):
    """A demo server's requests: those under /admin/ go to the server's admin actions, the others to
    the protocol's `get` and `post`."""

    server: DemoHTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive: every response carries Content-Length (or is chunked)
    disable_nagle_algorithm = True  # headers and body are two writes: don't let Nagle delay the second

    def do_GET(self) -> None:
        self._route(self.get)

    def do_POST(self) -> None:
        self._route(self.post)

    def get(self, url: SplitResult) -> None:
        raise NotImplementedError

    def post(self, url: SplitResult) -> None:
        raise NotImplementedError

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per request would cost more than the request at benchmark rates

    def _route(self, serve: Callable[[SplitResult], None]) -> None:
        url = urlsplit(self.path)
        (self._admin if url.path.startswith("/admin/") else serve)(url)

    def _admin(self, url: SplitResult) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self._send_json(*run_admin_action(self.server.demo.admin_actions(), self.command, url, body))

    def _send_json(self, status: int, value: object) -> None:
        self._send(status, json.dumps(value, ensure_ascii=False).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


class DemoServer:
    """A demo server's life: served by a thread from `start` (or `with`) to `stop`; `closing` is set
    when it stops (open streams end). `token` (required as a bearer token when set), `faults` and
    `gate` may be swapped at runtime; `fault_counts` counts the faults it played."""

    # where on the server its model is served, the end of `url` (FeedAPI's feed: /feed)
    url_path = ""

    def __init__(
        self, host: str, port: int, handler: type[DemoHandler], token: str | None = None, faults: Faults | None = None
    ) -> None:
        self.token = token
        self.faults = faults
        self.gate: Gate | None = None
        self.fault_counts: dict[str, int] = {}
        self.closing = threading.Event()
        self._lock = threading.Lock()
        self._httpd = DemoHTTPServer((host, port), self, handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        assert isinstance(host, str)  # an IPv4 address: (host, port)
        return f"http://{host}:{port}{self.url_path}"

    def admin_actions(self) -> AdminActions:
        """What /admin/ offers: the protocol's actions on the served model, and the faults."""
        return fault_admin_actions(self)

    def play_fault(self) -> tuple[str, int] | None:
        """The fault this request plays (its kind and Retry-After), counted; None: none."""
        faults = self.faults  # read once: it may be swapped concurrently
        kind = None if faults is None else faults.pick()
        if faults is None or kind is None:
            return None
        with self._lock:
            self.fault_counts[kind] = self.fault_counts.get(kind, 0) + 1
        return kind, faults.retry_after

    def counted_faults(self) -> dict[str, int]:
        with self._lock:
            return dict(self.fault_counts)

    def start(self) -> Self:
        # a short poll interval: `stop` waits for it, and tests start and stop many servers
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name=type(self).__name__, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.close_connections()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
