"""A real HTTP FeedAPI server over a `DemoFeed`, speaking v1, the v2 draft or the published v2: what it
answers (the discovery document, the pages) per dialect; `handler.py` routes its requests.

Built for throughput as much as for fidelity: payload bytes are encoded once by the feed, a page is a
join of byte strings, and connections are HTTP/1.1 keep-alive with Content-Length and TCP_NODELAY.
"""

from __future__ import annotations

import secrets
from urllib.parse import parse_qsl

from feedapi_dagster.demo.admin import AdminActions
from feedapi_dagster.demo.faults import Faults
from feedapi_dagster.demo.feedapi.admin import feed_admin_actions
from feedapi_dagster.demo.feedapi.demo_feed import DemoFeed, Event
from feedapi_dagster.demo.feedapi.fetch import (
    DRAFT_FILTERS,
    Fetch,
    FetchError,
    encode_cursor,
    parse_draft,
    parse_published,
    parse_v1,
)
from feedapi_dagster.demo.feedapi.handler import FeedHandler
from feedapi_dagster.demo.http_server import DemoServer

DIALECTS = ("v1", "draft", "published")
# with a filter, a page scans at most this many times its size, so that a filter matching nothing
# still answers quickly (with a cursor-only page that advances)
FILTER_SCAN_FACTOR = 10


class DemoFeedServer(DemoServer):
    """Serves `feed` on http://host:port/feed until stopped; use as a context manager."""

    url_path = "/feed"

    def __init__(
        self,
        feed: DemoFeed,
        dialect: str = "draft",
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        faults: Faults | None = None,
        *,
        ignore_filters: bool = False,
        empty_when_caught_up: bool = False,
        quirks: bool = False,
        stream: bool = True,
    ) -> None:
        """`stream`: the draft dialect offers `stream` fetches (discovery's flag); the others never do."""
        if dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {DIALECTS}")
        if dialect == "v1":
            feed.forbid_splits()
        self.feed = feed
        self.dialect = dialect
        self.ignore_filters = ignore_filters
        self.empty_when_caught_up = empty_when_caught_up
        self.quirks = quirks
        self.streams = stream and dialect == "draft"
        self._token_nonce = secrets.token_hex(4)
        self._token_epoch = 0
        super().__init__(host, port, FeedHandler, token, faults)

    @property
    def discovery_token(self) -> str:
        """The published dialect's token; it changes on `rotate_token` and on every split."""
        return f"{self._token_nonce}.{self._token_epoch}.{self.feed.version}"

    def rotate_token(self) -> str:
        with self._lock:
            self._token_epoch += 1
        return self.discovery_token

    def admin_actions(self) -> AdminActions:
        return {**feed_admin_actions(self.feed, self.rotate_token), **super().admin_actions()}

    def parse_fetch(self, query: str) -> Fetch:
        """Validate a fetch's query string for this dialect (400, or 409 for an old token)."""
        pairs = parse_qsl(query, keep_blank_values=True)
        params = dict(pairs)
        if self.dialect == "v1":
            return parse_v1(pairs, params, self.feed.partition_count())
        if self.dialect == "draft":
            return parse_draft(pairs, params, self.streams)
        return parse_published(params, self.discovery_token, self.ignore_filters)

    # ---- pages ---------------------------------------------------------------------------------

    def page(self, fetch: Fetch) -> bytes:
        """The NDJSON body for one fetch."""
        after = self.position(fetch)
        try:
            lines, _ = self.lines(fetch, after)
        except ValueError as e:
            raise FetchError(404, str(e)) from None
        if not lines:  # caught up
            return b"" if self.empty_when_caught_up else self.checkpoint(fetch.partition, after) + b"\n"
        if self.quirks:
            return b"".join(_quirky(lines))
        lines.append(b"")
        return b"\n".join(lines)

    def position(self, fetch: Fetch) -> int:
        """The seq that `fetch`'s cursor reads after (404 for a partition that is not listed)."""
        try:
            if fetch.cursor == "_first":
                return 0
            if fetch.cursor == "_last":
                return self.feed.last_seq(fetch.partition)
            return int(fetch.cursor[1:], 16)
        except ValueError as e:
            raise FetchError(404, str(e)) from None

    def lines(self, fetch: Fetch, after: int) -> tuple[list[bytes], int]:
        """The lines (events and checkpoints, the last a checkpoint) of up to `fetch.limit` events after
        seq `after`, and the seq they reach; none when there are no events after it. ValueError: the
        partition is not listed (any more)."""
        scan = fetch.limit if fetch.types is None else fetch.limit * FILTER_SCAN_FACTOR
        records = self.feed.read(fetch.partition, after, scan)
        if not records:
            return [], after
        lines: list[bytes] = []
        emitted = 0
        group = 0  # events left before the next checkpoint; drawn per group from the seq
        position = checkpointed = after
        for seq, event in records:
            position = seq  # filtered-out events advance the cursor too
            if not fetch.keeps(event):
                continue
            lines.append(self._event(fetch.partition, seq, event))
            emitted += 1
            group = group or 1 + (seq * 2654435761 >> 8) % 5  # 1..5 events per checkpoint
            group -= 1
            if group == 0 or emitted == fetch.limit:
                lines.append(self.checkpoint(fetch.partition, seq))
                checkpointed = seq
            if emitted == fetch.limit:
                break
        if checkpointed != position:
            lines.append(self.checkpoint(fetch.partition, position))
        return lines, position

    def _event(self, partition: int, seq: int, event: Event) -> bytes:
        if self.dialect == "draft":
            return b'{"event":' + event.payload + b"}"
        if self.dialect == "published":
            return b'{"data":' + event.payload + b"}"
        if seq % 5 == 0:  # v1 events may carry headers
            return b'{"partition":%d,"headers":{"x-seq":"%d"},"data":%s}' % (partition, seq, event.payload)
        return b'{"partition":%d,"data":%s}' % (partition, event.payload)

    def checkpoint(self, partition: int, seq: int) -> bytes:
        if self.dialect == "v1":
            return b'{"partition":%d,"cursor":"%s"}' % (partition, encode_cursor(seq).encode())
        return b'{"cursor":"%s"}' % encode_cursor(seq).encode()

    def discovery(self) -> dict[str, object]:
        """The discovery document of this dialect."""
        partitions: list[dict[str, object]] = []
        for p in self.feed.discovery():
            entry: dict[str, object] = {"id": str(p.id)}
            if p.closed:
                entry["closed"] = True
                if self.dialect == "draft":
                    entry["lastCursor"] = encode_cursor(p.last_seq)
            if p.starts_after is not None:
                entry["startsAfterPartition"] = str(p.starts_after)
            if p.cursor_from:
                entry["cursorFromPartitions"] = [str(a) for a in p.cursor_from]
            partitions.append(entry)
        if self.dialect == "published":
            return {"token": self.discovery_token, "partitions": partitions, "exactlyOnce": self.feed.exactly_once}
        document = {"partitions": partitions, "exactlyOnce": self.feed.exactly_once, "filters": list(DRAFT_FILTERS)}
        return {**document, "stream": True} if self.streams else document


def _quirky(lines: list[bytes]) -> list[bytes]:
    """Legal but awkward framing: some \\r\\n endings, blank lines, and commands from the future."""
    out: list[bytes] = []
    for i, line in enumerate(lines):
        out.append(line + (b"\r\n" if i % 3 == 1 else b"\n"))
        if i % 4 == 2:
            out.append(b"\n")
        if i % 5 == 0:
            out.append(b'{"resync":true}\n')
    return out
