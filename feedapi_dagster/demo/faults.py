"""Fault injection for fetch responses: the failures a consumer meets against real servers."""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler

KINDS = ("500", "503", "429", "reset", "truncated", "junk", "slow")


class Faults:
    """Decides, per fetch, whether to fail and how; deterministic for a given seed and call order."""

    def __init__(self, rate: float, seed: int = 0, retry_after: int = 1, kinds: tuple[str, ...] = KINDS) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError("rate must be in [0, 1]")
        unknown = set(kinds) - set(KINDS)
        if unknown or not kinds:
            raise ValueError(f"fault kinds must be a non-empty subset of {KINDS}")
        self.rate = rate
        self.seed = seed
        self.retry_after = retry_after
        self.kinds = tuple(kinds)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()  # requests are served on many threads

    def pick(self) -> str | None:
        with self._lock:
            return self._rng.choice(self.kinds) if self._rng.random() < self.rate else None


def send_fault(handler: BaseHTTPRequestHandler, kind: str, body: bytes, retry_after: int) -> None:
    """Answer the request with fault `kind` instead of the page `body` it would have returned."""
    if kind in ("500", "503", "429"):
        message = b"injected fault\n"
        handler.send_response(int(kind))
        handler.send_header("Content-Type", "text/plain; charset=utf-8")
        handler.send_header("Content-Length", str(len(message)))
        if kind == "429":
            handler.send_header("Retry-After", str(retry_after))
        handler.end_headers()
        handler.wfile.write(message)
    elif kind == "reset":
        # linger 0: closing sends a TCP RST, as a crashed server or a proxy cutting the line would
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        handler.close_connection = True
    elif kind == "truncated":
        cut = len(body) // 2
        if body[cut - 1 : cut] == b"\n":
            cut += 1  # land inside a line, not on a boundary
        _send_head(handler, max(len(body), 1))  # announce more than is sent
        handler.wfile.write(body[:cut])
        handler.close_connection = True
    elif kind == "junk":
        # what a Go server sends when it fails mid-stream: the lines so far, then its error text
        lines = body.splitlines(keepends=True)
        junk = b"".join(lines[: len(lines) // 2]) + b"Internal server error"
        _send_head(handler, len(junk))
        handler.wfile.write(junk)
    elif kind == "slow":
        _send_head(handler, len(body))
        step = max(1, -(-len(body) // 5))
        for start in range(0, len(body), step):
            if start:
                time.sleep(0.01)  # at most 4 pauses: 40 ms
            handler.wfile.write(body[start : start + step])
    else:
        raise ValueError(f"unknown fault kind {kind!r}")


def _send_head(handler: BaseHTTPRequestHandler, content_length: int) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/x-ndjson")
    handler.send_header("Content-Length", str(content_length))
    handler.end_headers()
