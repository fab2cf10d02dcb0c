"""A `stream` fetch of the FeedAPI demo server (the draft dialect): one chunked response open for the
fetch's duration (`y`: until the client leaves or the server stops) with the events already there,
then those appended while it is open, each batch ending in its checkpoint; a checkpoint that repeats
the cursor when the stream is quiet (a keep-alive); and the mid-stream faults (a cut, junk, a slow
batch)."""

from __future__ import annotations

import math
import threading
import time
from typing import Protocol

from feedapi_dagster.demo.feedapi.demo_feed import DemoFeed
from feedapi_dagster.demo.feedapi.fetch import Fetch
from feedapi_dagster.demo.http_server import DemoHandler

# a stream waits at most this long at a time, so that it notices a stopping server
_POLL = 0.1
# a quiet stream repeats its checkpoint this often: proxies and clients see that it lives
KEEP_ALIVE_SECONDS = 1.0
# the faults a stream plays once it has begun (the others are answered instead of the stream)
MID_STREAM_FAULTS = ("truncated", "junk", "slow")


class StreamSource(Protocol):
    """What a stream reads of its server (`DemoFeedServer`, which imports this module's handler)."""

    feed: DemoFeed
    closing: threading.Event

    def lines(self, fetch: Fetch, after: int) -> tuple[list[bytes], int]: ...

    def checkpoint(self, partition: int, seq: int) -> bytes: ...


def stream(handler: DemoHandler, server: StreamSource, fetch: Fetch, after: int, kind: str | None) -> None:
    """Answer `fetch` (whose cursor is seq `after`) with its stream, fault `kind` played."""
    assert fetch.stream is not None
    feed, partition = server.feed, fetch.partition
    end = time.monotonic() + fetch.stream
    handler.send_response(200)
    handler.send_header("Content-Type", "application/x-ndjson")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    out = _StreamWriter(handler, kind)
    written = -math.inf  # when the last line went out: never, so a checkpoint opens the stream
    try:
        while not server.closing.is_set():
            seen = feed.changes.count
            lines, after = server.lines(fetch, after)
            now = time.monotonic()
            if lines:
                out.write(lines)
                written = now
            elif now - written >= KEEP_ALIVE_SECONDS:
                out.write([server.checkpoint(partition, after)])
                written = now
            if now >= end or (not lines and feed.is_closed(partition)):  # a closed partition is drained
                break
            if not lines:  # caught up: sleep until an append, the keep-alive or the end
                feed.changes.wait(seen, max(0.0, min(_POLL, end - now, written + KEEP_ALIVE_SECONDS - now)))
        out.finish()
    except _Ended:
        pass
    except (_Cut, OSError):
        # a cut stream, a client that went away, a stopping server: no terminating chunk, no reuse
        handler.close_connection = True
    except ValueError:  # the partition was split (method 2) under the stream: it ends; the next fetch gets 404
        out.finish()


class _Cut(Exception):
    """The stream must end now without its terminating chunk (a truncated fault)."""


class _Ended(Exception):
    """The stream has been ended, terminating chunk included (a junk fault)."""


class _StreamWriter:
    """Writes lines as HTTP/1.1 chunks, one chunk a batch, and plays a mid-stream fault on the first
    batch with events: truncated (half of it, then the connection closes), junk (half of it, then a Go
    server's error text, and the end), slow (a line a chunk, with pauses)."""

    def __init__(self, handler: DemoHandler, kind: str | None) -> None:
        self._handler = handler
        self._wfile = handler.wfile
        self._fault = kind if kind in MID_STREAM_FAULTS else None

    def write(self, lines: list[bytes]) -> None:
        data = b"".join(line + b"\n" for line in lines)
        fault = self._fault
        if fault is None or len(lines) < 2:  # a checkpoint alone: the fault waits for events
            self._chunk(data)
            return
        self._fault = None
        cut = len(data) // 2
        if data[cut - 1 : cut] == b"\n":
            cut += 1  # land inside a line, not on a boundary
        if fault == "truncated":
            self._chunk(data[:cut])
            raise _Cut
        if fault == "junk":
            self._chunk(data[: data.rfind(b"\n", 0, cut) + 1] + b"Internal server error")
            self.finish()
            raise _Ended
        for line in lines:  # slow
            self._chunk(line + b"\n")
            time.sleep(0.01)

    def finish(self) -> None:
        try:
            self._wfile.write(b"0\r\n\r\n")
        except OSError:
            self._handler.close_connection = True  # the client has gone: nothing to end

    def _chunk(self, data: bytes) -> None:
        self._wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
