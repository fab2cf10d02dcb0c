"""Streaming reader of FeedAPI NDJSON bodies.

The reader turns byte chunks, however they were cut, into `Page`s: the events between two
checkpoints plus the cursor of the second. It holds at most one page and one partial line, has no
line-length cap (but an optional byte bound per page), and yields a page only once its checkpoint has
arrived, so events after the last checkpoint of a body are never handed out (they come back on the
next fetch).

Lines are decoded with msgspec in bulk: each event's payload is kept as the raw bytes the server
sent (validated JSON, never re-serialised), which is what a sink stores and is several times faster
than building Python objects for every payload.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgspec

from .errors import MalformedResponse
from .models import DONE_CURSORS, Page


class _Line(msgspec.Struct):
    """A protocol line. Unknown keys are ignored; a line with neither field is a future command."""

    event: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET  # draft
    data: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET  # v1 and published
    cursor: str | int | None = None


_DECODER = msgspec.json.Decoder(_Line)


class PageReader:
    """Reads the pages of one response body for one partition; `event_key` is the dialect's."""

    def __init__(self, partition_id: int, event_key: str, max_page_bytes: int | None = None):
        if event_key not in ("event", "data"):
            raise ValueError(f"unknown event key {event_key!r}")
        self.partition_id = partition_id
        self.event_key = event_key
        self.max_page_bytes = max_page_bytes

    def pages(self, chunks: Iterable[bytes]) -> Iterator[Page]:
        """Raises `MalformedResponse` when the body is damaged (invalid UTF-8, a line that is not a JSON
        object, an unterminated last line that is not JSON: a cut-short body or a server's junk
        trailer), after yielding the pages that complete checkpoints before the damage cover."""
        self._events: list[bytes] = []
        self._page_bytes = 0
        pending: list[bytes] = []
        pending_bytes = 0
        for chunk in chunks:
            cut = chunk.rfind(b"\n")
            if cut < 0:
                pending.append(chunk)
                pending_bytes += len(chunk)
                self._check_bound(self._page_bytes + pending_bytes)
                continue
            complete = b"".join((*pending, chunk[: cut + 1])) if pending else chunk[: cut + 1]
            rest = chunk[cut + 1:]
            pending, pending_bytes = ([rest], len(rest)) if rest else ([], 0)
            for page in self._lines(complete, terminated=True):
                yield page
                if page.done:
                    return
        if pending:
            yield from self._lines(b"".join(pending), terminated=False)

    def _lines(self, block: bytes, terminated: bool) -> Iterator[Page]:
        try:
            block.decode("utf-8")
            lines = _DECODER.decode_lines(block)
        except (UnicodeDecodeError, msgspec.DecodeError):
            # Find the damaged line, so that the pages before it still count.
            yield from self._lines_one_by_one(block, terminated)
            return
        yield from self._take(lines)

    def _lines_one_by_one(self, block: bytes, terminated: bool) -> Iterator[Page]:
        raw_lines = block.split(b"\n")
        for number, raw_line in enumerate(raw_lines):
            if not raw_line.strip():
                continue
            last = number == len(raw_lines) - 1
            try:
                raw_line.decode("utf-8")
                line = _DECODER.decode(raw_line)
            except UnicodeDecodeError as error:
                raise self._damage("body is not valid UTF-8") from error
            except msgspec.DecodeError as error:
                if last and not terminated:
                    raise self._damage("body ends in an incomplete or junk line") from error
                raise self._damage(f"line is not a FeedAPI JSON object ({error}): {_excerpt(raw_line)}") from error
            for page in self._take((line,)):
                yield page
                if page.done:
                    return

    def _take(self, lines: Iterable[_Line]) -> Iterator[Page]:
        key = self.event_key
        events = self._events
        for line in lines:
            raw = getattr(line, key)
            if raw is not msgspec.UNSET:
                payload = bytes(raw)
                events.append(payload)
                if self.max_page_bytes is not None:
                    self._page_bytes += len(payload)
                    self._check_bound(self._page_bytes)
                continue
            cursor = line.cursor
            if cursor is None:
                continue  # a command from a future protocol revision
            cursor = str(cursor)
            page = Page(self.partition_id, events, cursor="" if cursor in DONE_CURSORS else cursor,
                        done=cursor in DONE_CURSORS)
            events = self._events = []
            self._page_bytes = 0
            yield page
            if page.done:
                return

    def _check_bound(self, size: int) -> None:
        if self.max_page_bytes is not None and size > self.max_page_bytes:
            raise self._damage(f"more than {self.max_page_bytes} bytes of events without a checkpoint")

    def _damage(self, reason: str) -> MalformedResponse:
        return MalformedResponse(f"partition {self.partition_id}: {reason}", partition=self.partition_id)


def _excerpt(line: bytes, limit: int = 80) -> str:
    text = line[:limit].decode("utf-8", "replace")
    return repr(text + ("…" if len(line) > limit else ""))
