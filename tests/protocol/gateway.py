"""An API gateway that assumes short-lived requests: a TCP proxy on 127.0.0.1 that closes every
connection a fixed time after it was opened, whatever it is in the middle of."""

from __future__ import annotations

import select
import socket
import threading
import time
from urllib.parse import urlsplit, urlunsplit


class Gateway:
    """Proxies to the server of `upstream_url` (the same path on `url`), cutting each connection after
    `limit` seconds; `connections` and `cuts` count them. The first `timeouts` connections get a 504
    (`Retry-After: 0.3`) instead, as from a gateway that gave up waiting for the server."""

    GATEWAY_TIMEOUT = (
        b"HTTP/1.1 504 Gateway Timeout\r\nRetry-After: 0.3\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )

    def __init__(self, upstream_url: str, limit: float, timeouts: int = 0) -> None:
        parts = urlsplit(upstream_url)
        assert parts.hostname is not None and parts.port is not None
        self._upstream = (parts.hostname, parts.port)
        self.limit = limit
        self.timeouts = timeouts
        self.connections = 0
        self.cuts = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = urlunsplit(parts._replace(netloc=f"127.0.0.1:{self._listener.getsockname()[1]}"))
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            self.connections += 1
            if self.connections <= self.timeouts:
                threading.Thread(target=self._time_out, args=(client,), daemon=True).start()
            else:
                threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _time_out(self, client: socket.socket) -> None:
        with client:
            request = b""
            while b"\r\n\r\n" not in request and (data := client.recv(65536)):
                request += data
            client.sendall(self.GATEWAY_TIMEOUT)

    def _relay(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self._upstream)
        deadline = time.monotonic() + self.limit
        try:
            while (left := deadline - time.monotonic()) > 0:
                readable, _, _ = select.select([client, upstream], [], [], left)
                for source in readable:
                    data = source.recv(65536)
                    if not data:
                        return  # one side closed: so does the gateway
                    (upstream if source is client else client).sendall(data)
            self.cuts += 1
        except OSError:
            return
        finally:
            client.close()
            upstream.close()
