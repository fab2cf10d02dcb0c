"""A bundled Nakadi event bus for the demo and the tests: one event type behind the low-level stream API.

`NakadiEventType` is the in-memory log (partitions of business events with integer offsets, retention
and repartitioning); `NakadiDemoServer` serves it over HTTP as Nakadi does: `GET /event-types/{name}/
partitions[/{p}]` and the streaming `GET /event-types/{name}/events` with `X-Nakadi-Cursors`, one
`EventStreamBatch` per line in a chunked response, keep-alive batches when a partition is caught up,
and `application/problem+json` errors. The spec is `spec/nakadi-event-bus-api.yaml`.

Like `server.py`, event bytes are encoded once at publication and spliced into batches as stored.
"""
from __future__ import annotations

import argparse
import hmac
import json
import random
import re
import threading
import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

from feedapi_dagster.demo.faults import KINDS, Faults, send_fault
from feedapi_dagster.demo.http import (
    DemoHandler,
    DemoHTTPServer,
    ServedInThread,
    serve_until_signalled,
    token_from,
)

BEGIN = "BEGIN"
DEFAULT_PORT = 8766
# orders are drawn from a small pool so that an order has several events (in one partition, in order)
ORDER_POOL = 250
_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
_OFFSET = re.compile(r"001-0001-(\d{18})")
_EVENTS_PATH = re.compile(r"/event-types/([^/]+)/(events|partitions)(?:/([^/]+))?")
# the spec: a stream_timeout above this is treated as none given
MAX_STREAM_TIMEOUT = 4200.0
DEFAULT_BATCH_FLUSH_TIMEOUT = 30.0
# a stream waits at most this long at a time, so that it notices a stopping server
_POLL = 0.1
# mid-stream faults (truncated, junk) strike after this many complete lines; slow pauses this many
FAULT_AFTER_LINES = 2
SLOW_LINES = 5


def format_offset(n: int) -> str:
    """Nakadi's wire offset for integer offset `n` (zero-padded: string order is numeric order)."""
    return f"001-0001-{n:018d}"


def parse_offset(offset: str) -> int | None:
    """The integer offset of a wire offset, None for BEGIN (any case); ValueError if malformed."""
    if offset.upper() == BEGIN:
        return None
    match = _OFFSET.fullmatch(offset)
    if match is None:
        raise ValueError(f"malformed offset {offset!r}: expected BEGIN or 001-0001-<18 digits>")
    return int(match.group(1))


class UnknownPartitionError(LookupError):
    def __str__(self) -> str:
        return str(self.args[0])


class UnavailableOffsetError(ValueError):
    """A cursor before the retention window (or past the newest event)."""


@dataclass(slots=True)
class _Partition:
    first: int = 0  # offset of events[0]: the oldest available offset (the next offset when empty)
    events: list[bytes] = field(default_factory=list)  # the available events, in offset order
    eids: list[str] = field(default_factory=list)  # eid at every offset ever published, expired included

    @property
    def next(self) -> int:
        return self.first + len(self.events)


class NakadiEventType:
    """A seeded, thread-safe, in-memory Nakadi event type of business events ("order" events)."""

    def __init__(
        self,
        name: str = "demo.orders",
        partitions: int = 4,
        events: int = 1000,
        seed: int = 0,
        duplicate_ratio: float = 0.0,
    ) -> None:
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        if not 0.0 <= duplicate_ratio <= 1.0:
            raise ValueError("duplicate_ratio must be in [0, 1]")
        self.name = name
        self._duplicate_ratio = duplicate_ratio
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # streams wait on it for new events
        self._version = 0
        self._partitions = [_Partition() for _ in range(partitions)]
        self._all: dict[str, bytes] = {}  # eid -> bytes of every event ever published
        self._published = 0
        self.append(events)

    # ---- writing -------------------------------------------------------------------------------

    def append(self, count: int) -> None:
        """Publish `count` new events; with a duplicate ratio, some are published twice in a row."""
        if count < 0:
            raise ValueError("count must be >= 0")
        with self._lock:
            for _ in range(count):
                partition, eid, data = self._generate()
                self._publish(partition, eid, data)
                if self._duplicate_ratio and self._rng.random() < self._duplicate_ratio:
                    self._publish(partition, eid, data)  # at-least-once: the same event, the next offset
            self._bump()

    def repartition(self, count: int) -> list[int]:
        """Raise the partition count to `count` (Nakadi cannot lower it); returns the new partition ids.

        New partitions start empty; later events hash over the new count, so an order's later events
        may land elsewhere than its earlier ones, as on a real repartitioned event type."""
        with self._lock:
            old = len(self._partitions)
            if count <= old:
                raise ValueError(f"partitions can only be raised: the event type has {old}, asked for {count}")
            self._partitions.extend(_Partition() for _ in range(count - old))
            self._bump()
            return list(range(old, count))

    def expire(self, partition: int, keep_last: int) -> None:
        """Retention: drop all but the newest `keep_last` events of `partition`; offsets do not change."""
        if keep_last < 0:
            raise ValueError("keep_last must be >= 0")
        with self._lock:
            p = self._partition(partition)
            drop = max(0, len(p.events) - keep_last)
            del p.events[:drop]
            p.first += drop
            self._bump()

    # ---- reading -------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """Bumped on every change; pass it to `wait_for_change`."""
        with self._lock:
            return self._version

    def wait_for_change(self, version: int, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a change after `version`; True if there was one."""
        with self._changed:
            return self._changed.wait_for(lambda: self._version != version, max(0.0, timeout))

    def partition_count(self) -> int:
        with self._lock:
            return len(self._partitions)

    def partitions(self, cursors: Mapping[int, str] | None = None) -> list[dict[str, object]]:
        """The spec's `Partition` objects; those with a cursor (partition -> offset) get `unconsumed_events`."""
        cursors = dict(cursors or {})
        with self._lock:
            for partition in cursors:
                self._partition(partition)
            return [self.partition(p, cursors.get(p)) for p in range(len(self._partitions))]

    def partition(self, partition: int, consumed_offset: str | None = None) -> dict[str, object]:
        """One `Partition`. A partition that never had an event has newest_available_offset BEGIN; one whose
        events all expired keeps the offset of its last event as newest (as Kafka-backed Nakadi does)."""
        with self._lock:
            p = self._partition(partition)
            info: dict[str, object] = {
                "partition": str(partition),
                "oldest_available_offset": format_offset(p.first),
                "newest_available_offset": format_offset(p.next - 1) if p.next else BEGIN,
            }
            if consumed_offset is not None:
                # non-inclusive: a cursor at the newest event has 0 unconsumed events
                info["unconsumed_events"] = p.next - 1 - self.resolve(partition, consumed_offset)
            return info

    def resolve(self, partition: int, offset: str) -> int:
        """The last consumed offset a cursor stands for (BEGIN: just before the oldest available event).

        Raises UnknownPartitionError, ValueError (malformed) or UnavailableOffsetError (expired, or past
        the newest event)."""
        n = parse_offset(offset)
        with self._lock:
            p = self._partition(partition)
            if n is None:
                return p.first - 1
            if n < p.first - 1:
                raise UnavailableOffsetError(
                    f"offset {offset} for partition {partition} is unavailable: "
                    f"the oldest available offset is {format_offset(p.first)}"
                )
            if n >= p.next:
                newest = format_offset(p.next - 1) if p.next else BEGIN
                raise UnavailableOffsetError(
                    f"offset {offset} for partition {partition} is unavailable: "
                    f"the newest available offset is {newest}"
                )
            return n

    def read(self, partition: int, after_offset: str, limit: int) -> list[tuple[str, bytes]]:
        """Up to `limit` (offset, event bytes) after the exclusive `after_offset` (or BEGIN)."""
        after = self.resolve(partition, after_offset)
        return [(format_offset(after + 1 + i), data) for i, data in enumerate(self.read_raw(partition, after, limit))]

    def read_raw(self, partition: int, after: int, limit: int) -> list[bytes]:
        """Up to `limit` event bytes at offsets after+1, after+2, ... (the server's fast path).
        UnavailableOffsetError if offset after+1 has expired."""
        with self._lock:
            p = self._partition(partition)
            if after < p.first - 1:
                raise UnavailableOffsetError(
                    f"offset {format_offset(after)} for partition {partition} is unavailable: "
                    f"the oldest available offset is {format_offset(p.first)}"
                )
            start = after + 1 - p.first
            return p.events[start : start + limit]

    def expected_eids(self, partition: int | None = None) -> set[str]:
        """The eids published (to `partition`, or anywhere), expired ones included."""
        with self._lock:
            if partition is None:
                return set(self._all)
            return set(self._partition(partition).eids)

    def expected_events(self, partition: int, held: Sequence[str] = ()) -> list[str]:
        """What a consumer that drops repeated eids holds of `partition` once it read it from BEGIN,
        after the events `held` it held before: each available event's JSON once, in offset order."""
        with self._lock:
            p = self._partition(partition)
            seen = {json.loads(event)["metadata"]["eid"] for event in held}
            events = list(held)
            for eid, data in zip(p.eids[p.first:], p.events):
                if eid not in seen:
                    seen.add(eid)
                    events.append(data.decode())
            return events

    def published_count(self) -> int:
        """Publications, duplicates and expired events included."""
        with self._lock:
            return self._published

    def unique_count(self) -> int:
        """Distinct events (eids) ever published."""
        with self._lock:
            return len(self._all)

    def all_events(self) -> dict[str, bytes]:
        """eid -> bytes of every event ever published, expired included."""
        with self._lock:
            return dict(self._all)

    # ---- internals -----------------------------------------------------------------------------

    def _generate(self) -> tuple[int, str, bytes]:
        # one draw of random bits for the event's choices, one for its eid
        bits = self._rng.getrandbits(64)
        eid = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        seq = len(self._all) + 1
        order_number = f"o-{bits % ORDER_POOL}"
        partition = zlib.crc32(order_number.encode()) % len(self._partitions)
        occurred = _EPOCH + timedelta(seconds=seq, milliseconds=(bits >> 40) % 1000)
        event = {
            "metadata": {
                "eid": eid,
                "occurred_at": f"{occurred:%Y-%m-%dT%H:%M:%S}.{occurred.microsecond // 1000:03d}Z",
                "event_type": self.name,
                "partition": str(partition),
            },
            "order_number": order_number,
            "amount": 1 + (bits >> 16) % 99900 / 100,
            "seq": seq,
        }
        return partition, eid, json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()

    def _publish(self, partition: int, eid: str, data: bytes) -> None:
        p = self._partitions[partition]
        p.events.append(data)
        p.eids.append(eid)
        self._all[eid] = data
        self._published += 1

    def _bump(self) -> None:
        self._version += 1
        self._changed.notify_all()

    def _partition(self, partition: int) -> _Partition:
        if not 0 <= partition < len(self._partitions):
            raise UnknownPartitionError(f"partition {partition} does not exist in event type {self.name}")
        return self._partitions[partition]


# ---- the server --------------------------------------------------------------------------------


class NakadiGate:
    """Holds streams before they read `partition` (any partition if None) until opened: a test catches a
    stream in the middle of its read."""

    def __init__(self, partition: int | None = None) -> None:
        self.partition = partition
        self.arrived = threading.Event()  # a stream is being held
        self.opened = threading.Event()

    def hold(self, partition: int) -> None:
        if self.partition is not None and partition != self.partition:
            return
        self.arrived.set()
        self.opened.wait(120)


class _Problem(Exception):
    """An error answered as an `application/problem+json` Problem."""

    def __init__(self, status: int, detail: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers


def problem(status: int, detail: str) -> dict[str, object]:
    """The spec's `Problem` object."""
    title = HTTPStatus(status).phrase
    return {"type": f"https://httpstatus.es/{status}", "title": title, "status": status, "detail": detail}


@dataclass(slots=True)
class _StreamRequest:
    cursors: list[tuple[int, int, str]]  # (partition, last consumed offset, the offset as requested)
    batch_limit: int
    stream_limit: int  # 0: unlimited
    batch_flush_timeout: float
    stream_timeout: float  # 0: no limit
    keep_alive_limit: int  # 0: unlimited


class NakadiDemoServer(ServedInThread):
    """Serves `event_type` on http://host:port (the Nakadi base URL) until stopped; use as a context manager."""

    def __init__(
        self,
        event_type: NakadiEventType,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        faults: Faults | None = None,
        keep_alive_wait: float = 0.05,
    ) -> None:
        self.event_type = event_type
        self.token = token
        self.faults = faults  # swappable at runtime
        self.gate: NakadiGate | None = None  # swappable at runtime
        # a demo shortcut: a caught-up partition gets its keep-alive after min(batch_flush_timeout, this)
        self.keep_alive_wait = keep_alive_wait
        super().__init__(host, port, _Handler)


class _Cut(Exception):
    """The stream must end now without its terminating chunk (a truncated fault)."""


class _Ended(Exception):
    """The stream has been ended, terminating chunk included (a junk fault)."""


class _StreamWriter:
    """Writes batch lines as HTTP/1.1 chunks, and plays the mid-stream faults."""

    def __init__(self, handler: BaseHTTPRequestHandler, kind: str | None) -> None:
        self._wfile = handler.wfile
        self._kind = kind
        self._lines = 0

    def write(self, lines: list[bytes]) -> None:
        if not lines:
            return
        if self._kind is None:
            self._chunk(b"".join(lines))  # one chunk per round: fewer writes at high rates
            return
        for line in lines:
            self._line(line)

    def finish(self, fallback_line: bytes) -> None:
        """End the stream; a truncated or junk fault that has not struck yet strikes on `fallback_line`."""
        if self._kind in ("truncated", "junk"):
            self._lines = FAULT_AFTER_LINES
            self._line(fallback_line)  # raises
        self._wfile.write(b"0\r\n\r\n")

    def _line(self, line: bytes) -> None:
        if self._kind == "slow" and self._lines < SLOW_LINES:
            # a line split over two chunks, with a pause: the client must reassemble lines across reads
            half = len(line) // 2
            self._chunk(line[:half])
            time.sleep(0.01)
            self._chunk(line[half:])
        elif self._kind == "truncated" and self._lines == FAULT_AFTER_LINES:
            self._chunk(line[: len(line) // 2])
            raise _Cut
        elif self._kind == "junk" and self._lines == FAULT_AFTER_LINES:
            # what a failing server writes mid-stream: its error text, then a proper end of the body
            self._chunk(b"Internal server error")
            self._wfile.write(b"0\r\n\r\n")
            raise _Ended
        else:
            self._chunk(line)
        self._lines += 1

    def _chunk(self, data: bytes) -> None:
        self._wfile.write(b"%x\r\n%s\r\n" % (len(data), data))


def _batch_line(partition: int, offset: str, events: list[bytes] | None) -> bytes:
    cursor = b'{"cursor":{"partition":"%d","offset":"%s"}' % (partition, offset.encode())
    if events is None:  # keep-alive: the cursor only, no "events" key
        return cursor + b"}\n"
    return cursor + b',"events":[' + b",".join(events) + b"]}\n"


class _Handler(DemoHandler):
    server: DemoHTTPServer

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path.startswith("/admin/"):
            self._admin(url)
            return
        demo = self.server.demo
        try:
            match = _EVENTS_PATH.fullmatch(url.path)
            if match is None or (match.group(2) == "events" and match.group(3) is not None):
                raise _Problem(404, f"no resource {url.path}")
            self._authorize()
            name, resource, partition = unquote(match.group(1)), match.group(2), match.group(3)
            if name != demo.event_type.name:
                raise _Problem(404, f"event type {name} does not exist")
            params = {key: values[-1] for key, values in parse_qs(url.query, keep_blank_values=True).items()}
            if resource == "partitions":
                self._send_json(200, self._partitions(params, partition))
                return
            request = self._parse_stream(params)
        except _Problem as e:
            self._send_problem(e)
            return
        faults = demo.faults  # read once: it may be swapped concurrently
        kind = None if faults is None else faults.pick()
        if kind is not None:
            demo.record_fault(kind)
        if kind in ("500", "503", "429"):
            assert faults is not None
            retry = (("Retry-After", str(faults.retry_after)),) if kind == "429" else ()
            self._send_problem(_Problem(int(kind), "injected fault", retry))
        elif kind == "reset":
            send_fault(self, kind, b"", 0)
        else:
            self._stream(request, kind)

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        if url.path.startswith("/admin/"):
            self._admin(url)
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)  # drain it: the connection stays usable
        self._send_problem(_Problem(404, f"no resource POST {url.path} in the demo"))

    # ---- GET -----------------------------------------------------------------------------------

    def _authorize(self) -> None:
        token = self.server.demo.token
        if token is None:
            return
        header = self.headers.get("Authorization")
        challenge = (("WWW-Authenticate", "Bearer"),)
        if not header:
            raise _Problem(401, "no Authorization header: send Authorization: Bearer <token>", challenge)
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise _Problem(401, "the Authorization header is not a bearer token", challenge)
        # never echo the token sent: it may be a real credential sent to the wrong server
        if not hmac.compare_digest(value.strip().encode(), token.encode()):
            raise _Problem(403, "the bearer token may not read this event type")

    def _partitions(self, params: dict[str, str], partition: str | None) -> object:
        event_type = self.server.demo.event_type
        try:
            if partition is not None:
                return event_type.partition(_partition_id(partition, 404), params.get("consumed_offset"))
            cursors = None
            if "cursors" in params:
                cursors = {p: offset for p, offset in _parse_cursors(params["cursors"], "cursors")}
            return event_type.partitions(cursors)
        except UnknownPartitionError as e:
            raise _Problem(404 if partition is not None else 422, str(e)) from None
        except ValueError as e:
            raise _Problem(422, str(e)) from None

    def _parse_stream(self, params: dict[str, str]) -> _StreamRequest:
        batch_limit = int(_number(params, "batch_limit", 1, integer=True))
        stream_limit = int(_number(params, "stream_limit", 0, integer=True))
        flush = _number(params, "batch_flush_timeout", 0) or DEFAULT_BATCH_FLUSH_TIMEOUT  # 0: 30 s, as the spec says
        stream_timeout = _number(params, "stream_timeout", 0)
        keep_alive_limit = int(_number(params, "stream_keep_alive_limit", 0, integer=True))
        if stream_timeout > MAX_STREAM_TIMEOUT:
            stream_timeout = 0.0  # the spec: treated as not given
        if batch_limit < 1:
            raise _Problem(422, "batch_limit can't be lower than 1")
        if min(stream_limit, flush, stream_timeout, keep_alive_limit) < 0:
            raise _Problem(
                422, "stream_limit, batch_flush_timeout, stream_timeout and stream_keep_alive_limit must be >= 0"
            )
        if stream_limit and stream_limit < batch_limit:
            raise _Problem(422, "stream_limit can't be lower than batch_limit")
        if stream_timeout and stream_timeout < flush:
            raise _Problem(422, "stream_timeout can't be lower than batch_flush_timeout")
        header = self.headers.get("X-Nakadi-Cursors")
        if header is None:
            # real Nakadi then streams every partition from its newest event; the demo wants cursors
            raise _Problem(400, "the X-Nakadi-Cursors header is required by this demo server")
        event_type = self.server.demo.event_type
        cursors: list[tuple[int, int, str]] = []
        for partition, offset in _parse_cursors(header, "X-Nakadi-Cursors"):
            if any(p == partition for p, _, _ in cursors):
                raise _Problem(422, f"partition {partition} appears more than once in X-Nakadi-Cursors")
            try:
                cursors.append((partition, event_type.resolve(partition, offset), offset))
            except (LookupError, ValueError) as e:
                raise _Problem(422, str(e)) from None
        if not cursors:
            raise _Problem(422, "X-Nakadi-Cursors lists no cursor")
        return _StreamRequest(cursors, batch_limit, stream_limit, flush, stream_timeout, keep_alive_limit)

    def _stream(self, request: _StreamRequest, kind: str | None) -> None:
        demo, event_type = self.server.demo, self.server.demo.event_type
        self.send_response(200)
        self.send_header("Content-Type", "application/x-json-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        out = _StreamWriter(self, kind)
        wait = min(request.batch_flush_timeout, demo.keep_alive_wait)
        start = time.monotonic()
        deadline = start + request.stream_timeout if request.stream_timeout else None
        order = [p for p, _, _ in request.cursors]
        after = {p: position for p, position, _ in request.cursors}
        label = {p: offset for p, _, offset in request.cursors}  # the cursor a keep-alive repeats
        flushed = dict.fromkeys(order, start)  # when each partition last got a line
        idle = dict.fromkeys(order, 0)  # keep-alives in a row
        sent = 0
        try:
            while not demo.closing.is_set():
                version = event_type.version
                now = time.monotonic()
                lines: list[bytes] = []
                delivered = done = False
                for p in order:
                    limit = request.batch_limit
                    if request.stream_limit:
                        limit = min(limit, request.stream_limit - sent)
                    gate = demo.gate
                    if gate is not None:
                        out.write(lines)  # what is ready goes out before the stream is held
                        lines = []
                        gate.hold(p)
                    events = event_type.read_raw(p, after[p], limit)
                    if events:
                        after[p] += len(events)
                        label[p] = format_offset(after[p])
                        lines.append(_batch_line(p, label[p], events))
                        flushed[p], idle[p], delivered = now, 0, True
                        sent += len(events)
                        if request.stream_limit and sent >= request.stream_limit:
                            done = True
                            break
                    elif now - flushed[p] >= wait:
                        lines.append(_batch_line(p, label[p], None))
                        flushed[p] = now
                        idle[p] += 1
                out.write(lines)
                if request.keep_alive_limit and all(n >= request.keep_alive_limit for n in idle.values()):
                    done = True
                if done or (deadline is not None and now >= deadline):
                    break
                if not delivered:  # caught up everywhere: sleep until new events or the next keep-alive
                    timeout = min(flushed.values()) + wait - time.monotonic()
                    if deadline is not None:
                        timeout = min(timeout, deadline - time.monotonic())
                    event_type.wait_for_change(version, min(timeout, _POLL))
            out.finish(_batch_line(order[0], label[order[0]], None))
        except _Ended:
            pass
        except (_Cut, BrokenPipeError, ConnectionResetError, OSError):
            # a cut stream, a client that went away, a stopping server: no terminating chunk, no reuse
            self.close_connection = True
        except UnavailableOffsetError:
            # the partition expired under a slow stream: end it; the client's next request gets the 422
            self._end_quietly()

    def _end_quietly(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True

    # ---- admin ---------------------------------------------------------------------------------

    def _admin(self, url: SplitResult) -> None:
        """Drive the event type over HTTP (for the console demo). Not authenticated, never faulty."""
        demo, event_type = self.server.demo, self.server.demo.event_type
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        action = (self.command, url.path)
        try:
            args = json.loads(raw) if raw.strip() else {}
            if not isinstance(args, dict):
                raise TypeError("the request body must be a JSON object")
            if action == ("POST", "/admin/append"):
                count = int(args.get("count", 1))
                event_type.append(count)
                result: object = {"appended": count, "published": event_type.published_count()}
            elif action == ("POST", "/admin/repartition"):
                result = {"new_partitions": event_type.repartition(int(args["partitions"]))}
            elif action == ("POST", "/admin/expire"):
                partition = int(args["partition"])
                event_type.expire(partition, int(args["keep_last"]))
                result = event_type.partition(partition)
            elif action == ("POST", "/admin/faults"):
                demo.faults = Faults(
                    float(args.get("rate", 0.0)),
                    int(args.get("seed", 0)),
                    int(args.get("retry_after", 1)),
                    tuple(args.get("kinds", KINDS)),
                )
                result = {"rate": demo.faults.rate, "seed": demo.faults.seed, "kinds": list(demo.faults.kinds)}
            elif action == ("GET", "/admin/stats"):
                with demo._lock:
                    fault_counts = dict(demo.fault_counts)
                result = {
                    "published": event_type.published_count(),
                    "unique": event_type.unique_count(),
                    "partitions": event_type.partition_count(),
                    "fault_counts": fault_counts,
                }
            else:
                self._send_json(404, {"error": f"no admin action {self.command} {url.path}"})
                return
        except KeyError as e:
            self._send_json(400, {"error": f"missing field {e}"})
        except (ValueError, TypeError, LookupError) as e:
            self._send_json(400, {"error": str(e)})
        else:
            self._send_json(200, result)

    # ---- responses -----------------------------------------------------------------------------

    def _send_problem(self, e: _Problem) -> None:
        body = json.dumps(problem(e.status, e.detail)).encode()
        self._send(e.status, body, "application/problem+json", e.headers)



def _number(params: dict[str, str], name: str, default: float, *, integer: bool = False) -> float:
    value = params.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value) if integer else float(value)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise _Problem(400, f"{name} must be {kind}, not {value!r}") from None


def _partition_id(value: object, status: int) -> int:
    """A partition id as Nakadi writes it (a decimal string; an int is tolerated)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    raise _Problem(status, f"malformed partition {value!r}: expected a partition id such as \"0\"")


def _parse_cursors(text: str, where: str) -> list[tuple[int, str]]:
    """[(partition, offset)] of a JSON list of `Cursor`s; a 422 Problem if it is not one."""
    try:
        value = json.loads(text)
    except ValueError:
        raise _Problem(422, f"{where} is not valid JSON") from None
    if not isinstance(value, list):
        raise _Problem(422, f"{where} must be a JSON list of cursors")
    cursors: list[tuple[int, str]] = []
    for cursor in value:
        if not isinstance(cursor, dict) or not isinstance(cursor.get("offset"), str) or "partition" not in cursor:
            raise _Problem(422, f'{where}: every cursor must be an object {{"partition": "0", "offset": "BEGIN"}}')
        cursors.append((_partition_id(cursor["partition"], 422), cursor["offset"]))
    return cursors


# ---- `feedapi-dagster nakadi-server` -----------------------------------------------------------


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("nakadi-server", help="serve a generated Nakadi event type on HTTP")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    parser.add_argument("--event-type", default="demo.orders", help="the event type's name")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--events", type=int, default=10000)
    parser.add_argument("--token-env", metavar="NAME", help="require `Authorization: Bearer $NAME`")
    # Nakadi is at-least-once: a demo without duplicates would not show it
    parser.add_argument("--duplicate-ratio", type=float, default=0.05, help="share of events published twice")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="share of event streams that fail")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    event_type = NakadiEventType(
        args.event_type, partitions=args.partitions, events=args.events, seed=args.seed,
        duplicate_ratio=args.duplicate_ratio,
    )
    faults = Faults(args.fault_rate, seed=args.seed) if args.fault_rate else None
    return serve_until_signalled(NakadiDemoServer(event_type, host=args.host, port=args.port,
                                                  token=token_from(args.token_env), faults=faults))
