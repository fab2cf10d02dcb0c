"""What the bundled demo servers share: a threaded HTTP/1.1 server that really stops (its open
connections are shut down), the handler's plain responses, running it in a thread, and a console
command that serves until SIGINT/SIGTERM."""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self


class DemoHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], demo: Any, handler: type[BaseHTTPRequestHandler]) -> None:
        self.demo = demo
        # open connections (keep-alive, streams), shut down on stop so that a stopped server really stops
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request, client_address):  # type: ignore[no-untyped-def]
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):  # type: ignore[no-untyped-def]
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
    protocol_version = "HTTP/1.1"  # keep-alive: every response carries Content-Length (or is chunked)
    disable_nagle_algorithm = True  # headers and body are two writes: don't let Nagle delay the second

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per request would cost more than the request at benchmark rates

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


class ServedInThread:
    """A demo server's life: served by a thread from `start` (or `with`) to `stop`; `closing` is set
    when it stops (open streams end), `fault_counts` counts the faults it played."""

    def __init__(self, host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> None:
        self.fault_counts: dict[str, int] = {}
        self.closing = threading.Event()
        self._lock = threading.Lock()
        self._httpd = DemoHTTPServer((host, port), self, handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def record_fault(self, kind: str) -> None:
        with self._lock:
            self.fault_counts[kind] = self.fault_counts.get(kind, 0) + 1

    def start(self) -> Self:
        # a short poll interval: `stop` waits for it, and tests start and stop many servers
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        name=type(self).__name__, daemon=True)
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

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def token_from(env_name: str | None) -> str | None:
    """A console command's `--token-env`: the token the server requires, read from that variable."""
    if not env_name:
        return None
    token = os.environ.get(env_name)
    if not token:
        raise SystemExit(f"environment variable {env_name} is not set")
    return token


def serve_until_signalled(server: ServedInThread) -> int:
    """Serve, print the server's URL (what a caller waits for), and stop on SIGINT or SIGTERM."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with server:
        print(server.url, flush=True)
        stop.wait()
    return 0
