"""A proxy that cuts HTTP answers mid-body, as a proxy or a load balancer that drops a connection does:
an HTTP/1.1 proxy on 127.0.0.1 in front of one server, one request per connection."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

# headers of one hop, which the proxy sets itself
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "proxy-connection"}


@dataclass
class Cut:
    """Which answers to cut (`matches(path, status)`), how many of them (None: every one) and how:
    `length` announces the body's length (Content-Length) and `chunked` a chunk of it; either way
    the proxy sends the status, the headers and half of that, then closes the connection."""

    matches: Callable[[str, int], bool]
    times: int | None = None
    framing: Literal["length", "chunked"] = "length"
    done: int = 0  # answers cut so far


class CuttingProxy(AbstractContextManager["CuttingProxy"]):
    """Forwards to the server of `upstream_url` (the same path on `url`) and cuts the answers a `Cut`
    of `cuts` matches (the first that matches, while it has cuts left); `passed` counts the answers
    let through whole."""

    def __init__(self, upstream_url: str, *cuts: Cut, timeout: float = 30.0) -> None:
        parts = urlsplit(upstream_url)
        assert parts.hostname is not None and parts.port is not None
        self._upstream = (parts.hostname, parts.port)
        self.cuts = list(cuts)
        self.timeout = timeout
        self.passed = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = urlunsplit(parts._replace(netloc=f"127.0.0.1:{self._listener.getsockname()[1]}"))
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            client.settimeout(self.timeout)
            head = b""
            while b"\r\n\r\n" not in head and (data := client.recv(65536)):
                head += data
            if b"\r\n\r\n" not in head:
                return
            request_line, *lines = head.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
            method, target, _ = request_line.split(" ", 2)
            headers = dict(line.split(": ", 1) for line in lines if line)
            upstream = http.client.HTTPConnection(*self._upstream, timeout=self.timeout)
            try:
                upstream.request(
                    method, target, headers={k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}
                )
                answer = upstream.getresponse()
                cut = self._cut_for(urlsplit(target).path, answer.status)
                if cut is None:
                    self._relay(client, answer)
                else:
                    self._send_cut(client, answer, cut)
            except (OSError, http.client.HTTPException):
                return  # the client or the server went away
            finally:
                upstream.close()

    def _cut_for(self, path: str, status: int) -> Cut | None:
        with self._lock:
            for cut in self.cuts:
                if (cut.times is None or cut.done < cut.times) and cut.matches(path, status):
                    cut.done += 1
                    return cut
            self.passed += 1
            return None

    @staticmethod
    def _head(answer: http.client.HTTPResponse, framing: str) -> bytes:
        lines = [f"HTTP/1.1 {answer.status} {answer.reason}"]
        lines += [f"{k}: {v}" for k, v in answer.getheaders() if k.lower() not in _HOP_HEADERS]
        lines += [framing, "Connection: close"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _relay(self, client: socket.socket, answer: http.client.HTTPResponse) -> None:
        """The whole answer, as it comes (a stream's chunks as the server sends them)."""
        if answer.length is not None:
            body = answer.read()
            client.sendall(self._head(answer, f"Content-Length: {len(body)}") + body)
            return
        client.sendall(self._head(answer, "Transfer-Encoding: chunked"))
        while chunk := answer.read1(65536):
            client.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        client.sendall(b"0\r\n\r\n")

    def _send_cut(self, client: socket.socket, answer: http.client.HTTPResponse, cut: Cut) -> None:
        """The status and headers, then half of the body (of a stream: of what its first read gave)
        announced whole, then the connection closes."""
        body = answer.read() if answer.length is not None else answer.read1(65536)
        announced = max(len(body), 1)  # an empty body is cut too: one byte announced, none sent
        sent = body[: len(body) // 2]
        if cut.framing == "length":
            client.sendall(self._head(answer, f"Content-Length: {announced}") + sent)
        else:
            client.sendall(self._head(answer, "Transfer-Encoding: chunked") + b"%x\r\n%s" % (announced, sent))
        client.shutdown(socket.SHUT_RDWR)
