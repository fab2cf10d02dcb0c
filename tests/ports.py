"""Free ports for the servers the tests and benchmarks start (the package itself binds fixed ports)."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def find_free_port(host: str = LOOPBACK) -> int:
    """An ephemeral port that is free right now on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
