"""Streaming reader of FeedAPI NDJSON bodies.

The reader turns byte chunks, however they were cut, into `PageRun`s: the pages completed by a block
of lines, each page being the events between two checkpoints plus the cursor of the second. It holds
at most one block, one unfinished page and one partial line, has no line-length cap (but an optional
byte bound per page), and hands a page out only once its checkpoint has arrived, so events after the
last checkpoint of a body are never handed out (they come back on the next fetch). How a block's
lines are decoded into events and checkpoints: `lines.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from feedapi_dagster.errors import MalformedResponse

from ..models import DONE_CURSORS, PageRun
from .lines import EVENT_KEYS, scan_lines


class PageReader:
    """Reads the pages of one response body for one partition; `event_key` is the dialect's."""

    def __init__(self, partition_id: int, event_key: str, max_page_bytes: int | None = None):
        if event_key not in EVENT_KEYS:
            raise ValueError(f"unknown event key {event_key!r}")
        self.partition_id = partition_id
        self.event_key = event_key
        self.max_page_bytes = max_page_bytes

    def runs(self, chunks: Iterable[bytes]) -> Iterator[PageRun]:
        """Raises `MalformedResponse` when the body is damaged (invalid UTF-8, a line that is not a JSON
        object, an unterminated last line that is not JSON: a cut-short body or a server's junk
        trailer), after yielding the pages that complete checkpoints before the damage."""
        self._events: list[bytes] = []  # events of the page not finished yet
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
            rest = chunk[cut + 1 :]
            pending, pending_bytes = ([rest], len(rest)) if rest else ([], 0)
            for run in self._lines(complete, terminated=True):
                yield run
                if run.done:
                    return
        if pending:
            yield from self._lines(b"".join(pending), terminated=False)

    def _lines(self, block: bytes, terminated: bool) -> Iterator[PageRun]:
        """The pages completed by the lines of `block`; the pages before a damaged line still count."""
        events, ends, sizes, cursors, size, damage = scan_lines(block, self.event_key)
        carried, carried_bytes = self._events, self._page_bytes
        if cursors:
            done = not DONE_CURSORS.isdisjoint(cursors)
            if done:
                last = next(index for index, cursor in enumerate(cursors) if cursor in DONE_CURSORS) + 1
                ends, sizes, cursors = ends[:last], sizes[:last], cursors[:last]
                cursors[-1] = ""
            over = self._page_over_bound(carried_bytes, sizes)
            if over is not None:  # the pages before it still count
                ends, cursors, done = ends[:over], cursors[:over], False
            if cursors:
                taken = ends[-1]
                if carried:
                    ends = [len(carried) + end for end in ends]
                taken_bytes = sizes[len(cursors) - 1]
                self._events = [] if done else events[taken:]
                self._page_bytes = size - taken_bytes
                raws = events if taken == len(events) else events[:taken]
                yield PageRun(
                    self.partition_id,
                    carried + raws if carried else raws,
                    ends,
                    cursors,
                    carried_bytes + taken_bytes,
                    done,
                )
                if done:
                    return
            if over is not None:
                raise self._bound_exceeded()
        else:
            self._events = carried + events if carried else events
            self._page_bytes = carried_bytes + size
        self._check_bound(self._page_bytes)
        if damage is not None:
            kind, start, end, message = damage
            if kind == "utf8":
                raise self._damage("body is not valid UTF-8")
            if not terminated and not block[end:].strip():
                raise self._damage("body ends in an incomplete or junk line")
            raise self._damage(f"line is not a FeedAPI JSON object ({message}): {_excerpt(block[start:end])}")

    def _page_over_bound(self, carried_bytes: int, sizes: list[int]) -> int | None:
        """The first page with more payload bytes than the bound (those carried from earlier blocks
        count towards the first), if any."""
        if self.max_page_bytes is None or carried_bytes + sizes[-1] <= self.max_page_bytes:
            return None
        before = -carried_bytes
        for index, size in enumerate(sizes):
            if size - before > self.max_page_bytes:
                return index
            before = size
        return None

    def _check_bound(self, size: int) -> None:
        if self.max_page_bytes is not None and size > self.max_page_bytes:
            raise self._bound_exceeded()

    def _bound_exceeded(self) -> MalformedResponse:
        return self._damage(f"more than {self.max_page_bytes} bytes of events without a checkpoint")

    def _damage(self, reason: str) -> MalformedResponse:
        return MalformedResponse(f"partition {self.partition_id}: {reason}", partition=self.partition_id)


def _excerpt(line: bytes, limit: int = 80) -> str:
    text = line[:limit].decode("utf-8", "replace")
    return repr(text + ("…" if len(line) > limit else ""))
