"""The event stream of the demo Nakadi server: one `EventStreamBatch` per line in a chunked response,
keep-alive batches when a partition is caught up, and the mid-stream faults (a cut, junk, a slow line)."""

from __future__ import annotations

import time
from http.server import BaseHTTPRequestHandler

from feedapi_dagster.demo.http_server import DemoHandler
from feedapi_dagster.demo.nakadi.event_type import UnavailableOffsetError
from feedapi_dagster.demo.nakadi.offsets import format_offset
from feedapi_dagster.demo.nakadi.stream_request import StreamRequest

# a stream waits at most this long at a time, so that it notices a stopping server
_POLL = 0.1
# mid-stream faults (truncated, junk) strike after this many complete lines; slow pauses this many
FAULT_AFTER_LINES = 2
SLOW_LINES = 5


def stream(handler: DemoHandler, request: StreamRequest, kind: str | None) -> None:
    """Answer with the requested stream: batch lines in a chunked response, fault `kind` played."""
    demo, event_type = handler.server.demo, handler.server.demo.event_type
    handler.send_response(200)
    handler.send_header("Content-Type", "application/x-json-stream")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    out = _StreamWriter(handler, kind)
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
            version = event_type.changes.count
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
                event_type.changes.wait(version, min(timeout, _POLL))
        out.finish(_batch_line(order[0], label[order[0]], None))
    except _Ended:
        pass
    except (_Cut, BrokenPipeError, ConnectionResetError, OSError):
        # a cut stream, a client that went away, a stopping server: no terminating chunk, no reuse
        handler.close_connection = True
    except UnavailableOffsetError:
        # the partition expired under a slow stream: end it; the client's next request gets the 422
        _end_quietly(handler)


def _end_quietly(handler: BaseHTTPRequestHandler) -> None:
    try:
        handler.wfile.write(b"0\r\n\r\n")
    except OSError:
        handler.close_connection = True


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
