"""The HTTP handler of the FeedAPI demo server: a request's route per dialect (discovery or fetch: a page,
or a stream), its bearer token, and the fault or the held read a server may be given."""

from __future__ import annotations

from urllib.parse import SplitResult

from feedapi_dagster.demo.faults import send_fault
from feedapi_dagster.demo.feedapi.fetch import FetchError
from feedapi_dagster.demo.feedapi.stream import MID_STREAM_FAULTS, stream
from feedapi_dagster.demo.http_server import DemoHandler
from feedapi_dagster.demo.tokens import bearer_token, is_token


class FeedHandler(DemoHandler):
    def get(self, url: SplitResult) -> None:
        demo = self.server.demo
        try:
            if demo.token is not None and not self._authorized(demo.token):
                self._send(401, b"unauthorized\n", "text/plain; charset=utf-8", (("WWW-Authenticate", "Bearer"),))
                return
            # v1 has no discovery: its argument-less GET falls through to the fetch and gets a 400
            if url.path == "/feed" and (demo.dialect == "published" or (demo.dialect == "draft" and not url.query)):
                self._send_json(200, demo.discovery())
                return
            if url.path != ("/feed/events" if demo.dialect == "published" else "/feed"):
                raise FetchError(404, "not found")
            fetch = demo.parse_fetch(url.query)
            if fetch.stream is None:
                body = demo.page(fetch)
            else:
                after = demo.position(fetch)
        except FetchError as e:
            self._send(e.status, e.message.encode() + b"\n", "text/plain; charset=utf-8")
            return
        gate = demo.gate
        if gate is not None:
            gate.hold(fetch.partition)
        kind, retry_after = demo.play_fault() or (None, 0)
        if fetch.stream is None:
            if kind is None:
                self._send(200, body, "application/x-ndjson")
            else:
                send_fault(self, kind, body, retry_after)
        elif kind is None or kind in MID_STREAM_FAULTS:
            stream(self, demo, fetch, after, kind)
        else:
            send_fault(self, kind, b"", retry_after)  # a refused or reset stream

    def post(self, url: SplitResult) -> None:
        self._send(404, b"not found\n", "text/plain; charset=utf-8")

    def _authorized(self, token: str) -> bool:
        sent = bearer_token(self.headers.get("Authorization"))
        return sent is not None and is_token(sent, token)
