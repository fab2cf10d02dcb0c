"""The HTTP handler of the demo Nakadi server: `GET /event-types/{name}` (the event type, with its JSON
Schema), `GET /event-types/{name}/partitions[/{p}]` and the streaming `GET /event-types/{name}/events`,
its bearer token, its faults, and `application/problem+json` errors."""

from __future__ import annotations

import json
import re
from urllib.parse import SplitResult, parse_qs, unquote

from feedapi_dagster.demo.faults import send_fault
from feedapi_dagster.demo.http_server import DemoHandler
from feedapi_dagster.demo.nakadi.event_type import UnknownPartitionError
from feedapi_dagster.demo.nakadi.problems import Problem, problem
from feedapi_dagster.demo.nakadi.stream import stream
from feedapi_dagster.demo.nakadi.stream_request import (
    parse_cursors,
    parse_stream_request,
    partition_id,
)
from feedapi_dagster.demo.tokens import bearer_token, is_token

_EVENT_TYPE_PATH = re.compile(r"/event-types/([^/]+)(?:/(events|partitions)(?:/([^/]+))?)?")


class NakadiHandler(DemoHandler):
    def get(self, url: SplitResult) -> None:
        demo = self.server.demo
        try:
            match = _EVENT_TYPE_PATH.fullmatch(url.path)
            if match is None or (match.group(2) == "events" and match.group(3) is not None):
                raise Problem(404, f"no resource {url.path}")
            self._authorize()
            name, resource, partition = unquote(match.group(1)), match.group(2), match.group(3)
            if name != demo.event_type.name:
                raise Problem(404, f"event type {name} does not exist")
            params = {key: values[-1] for key, values in parse_qs(url.query, keep_blank_values=True).items()}
            if resource is None:
                self._send_json(200, demo.event_type.definition())
                return
            if resource == "partitions":
                self._send_json(200, self._partitions(params, partition))
                return
            request = parse_stream_request(params, self.headers.get("X-Nakadi-Cursors"), demo.event_type)
        except Problem as e:
            self._send_problem(e)
            return
        kind, retry_after = demo.play_fault() or (None, 0)
        if kind in ("500", "503", "429"):
            retry = (("Retry-After", str(retry_after)),) if kind == "429" else ()
            self._send_problem(Problem(int(kind), "injected fault", retry))
        elif kind == "reset":
            send_fault(self, kind, b"", 0)
        else:
            stream(self, request, kind)

    def post(self, url: SplitResult) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)  # drain it: the connection stays usable
        self._send_problem(Problem(404, f"no resource POST {url.path} in the demo"))

    def _authorize(self) -> None:
        token = self.server.demo.token
        if token is None:
            return
        header = self.headers.get("Authorization")
        challenge = (("WWW-Authenticate", "Bearer"),)
        if not header:
            raise Problem(401, "no Authorization header: send Authorization: Bearer <token>", challenge)
        sent = bearer_token(header)
        if sent is None:
            raise Problem(401, "the Authorization header is not a bearer token", challenge)
        # never echo the token sent: it may be a real credential sent to the wrong server
        if not is_token(sent, token):
            raise Problem(403, "the bearer token may not read this event type")

    def _partitions(self, params: dict[str, str], partition: str | None) -> object:
        event_type = self.server.demo.event_type
        try:
            if partition is not None:
                return event_type.partition(partition_id(partition, 404), params.get("consumed_offset"))
            cursors = None
            if "cursors" in params:
                cursors = {p: offset for p, offset in parse_cursors(params["cursors"], "cursors")}
            return event_type.partitions(cursors)
        except UnknownPartitionError as e:
            raise Problem(404 if partition is not None else 422, str(e)) from None
        except ValueError as e:
            raise Problem(422, str(e)) from None

    def _send_problem(self, e: Problem) -> None:
        body = json.dumps(problem(e.status, e.detail)).encode()
        self._send(e.status, body, "application/problem+json", e.headers)
