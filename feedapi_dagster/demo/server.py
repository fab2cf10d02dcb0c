"""A real HTTP FeedAPI server over a `DemoFeed`, speaking v1, the v2 draft or the published v2.

Built for throughput as much as for fidelity: payload bytes are encoded once by the feed, a page is a
join of byte strings, and connections are HTTP/1.1 keep-alive with Content-Length and TCP_NODELAY.
"""
from __future__ import annotations

import hmac
import json
import re
import secrets
import threading
from dataclasses import dataclass
from urllib.parse import SplitResult, parse_qs, parse_qsl, urlsplit

from feedapi_dagster.demo.faults import KINDS, Faults, send_fault
from feedapi_dagster.demo.feed import DemoFeed, Event
from feedapi_dagster.demo.http import DemoHandler, DemoHTTPServer, ServedInThread

DIALECTS = ("v1", "draft", "published")
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 100_000
# with a filter, a page scans at most this many times its size, so that a filter matching nothing
# still answers quickly (with a cursor-only page that advances)
FILTER_SCAN_FACTOR = 10
DRAFT_FILTERS = ("type",)

# Cursors encode the global seq, zero-padded so that they also sort as strings.
_CURSOR = re.compile(r"c[0-9a-f]{12}")


def encode_cursor(seq: int) -> str:
    return f"c{seq:012x}"


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class _Fetch:
    partition: int
    cursor: str
    limit: int
    types: frozenset[str] | None = None  # event-type filter; None keeps every event
    include: bool = True  # keep the listed types (True) or skip them (False)

    def keeps(self, event: Event) -> bool:
        return self.types is None or (event.type in self.types) == self.include


class Gate:
    """Holds fetch responses until opened: a test catches a load in the middle of its read.
    `partition`: hold only the fetches of that partition (others pass)."""

    def __init__(self, partition: int | None = None) -> None:
        self.partition = partition
        self.arrived = threading.Event()  # a fetch is being held
        self.opened = threading.Event()

    def hold(self, fetch: _Fetch) -> None:
        if self.partition is not None and fetch.partition != self.partition:
            return
        self.arrived.set()
        self.opened.wait(120)


class DemoFeedServer(ServedInThread):
    """Serves `feed` on http://host:port/feed until stopped; use as a context manager."""

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
    ) -> None:
        if dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {DIALECTS}")
        if dialect == "v1":
            feed.forbid_splits()
        self.feed = feed
        self.dialect = dialect
        self.token = token
        self.faults = faults  # swappable at runtime
        self.gate: Gate | None = None  # swappable at runtime
        self.ignore_filters = ignore_filters
        self.empty_when_caught_up = empty_when_caught_up
        self.quirks = quirks
        self._token_nonce = secrets.token_hex(4)
        self._token_epoch = 0
        super().__init__(host, port, _Handler)

    @property
    def url(self) -> str:
        return f"{super().url}/feed"

    @property
    def discovery_token(self) -> str:
        """The published dialect's token; it changes on `rotate_token` and on every split."""
        return f"{self._token_nonce}.{self._token_epoch}.{self.feed.version}"

    def rotate_token(self) -> str:
        with self._lock:
            self._token_epoch += 1
        return self.discovery_token

    # ---- pages ---------------------------------------------------------------------------------

    def _page(self, fetch: _Fetch) -> bytes:
        """The NDJSON body for one fetch."""
        feed = self.feed
        try:
            if fetch.cursor == "_first":
                after = 0
            elif fetch.cursor == "_last":
                after = feed.last_seq(fetch.partition)
            else:
                after = int(fetch.cursor[1:], 16)
            scan = fetch.limit if fetch.types is None else fetch.limit * FILTER_SCAN_FACTOR
            records = feed.read(fetch.partition, after, scan)
        except ValueError as e:
            raise _HttpError(404, str(e)) from None
        if not records:  # caught up
            return b"" if self.empty_when_caught_up else self._checkpoint(fetch.partition, after) + b"\n"
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
                lines.append(self._checkpoint(fetch.partition, seq))
                checkpointed = seq
            if emitted == fetch.limit:
                break
        if checkpointed != position:
            lines.append(self._checkpoint(fetch.partition, position))
        if self.quirks:
            return b"".join(_quirky(lines))
        lines.append(b"")
        return b"\n".join(lines)

    def _event(self, partition: int, seq: int, event: Event) -> bytes:
        if self.dialect == "draft":
            return b'{"event":' + event.payload + b"}"
        if self.dialect == "published":
            return b'{"data":' + event.payload + b"}"
        if seq % 5 == 0:  # v1 events may carry headers
            return b'{"partition":%d,"headers":{"x-seq":"%d"},"data":%s}' % (partition, seq, event.payload)
        return b'{"partition":%d,"data":%s}' % (partition, event.payload)

    def _checkpoint(self, partition: int, seq: int) -> bytes:
        if self.dialect == "v1":
            return b'{"partition":%d,"cursor":"%s"}' % (partition, encode_cursor(seq).encode())
        return b'{"cursor":"%s"}' % encode_cursor(seq).encode()

    def _discovery(self) -> dict[str, object]:
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
        return {"partitions": partitions, "exactlyOnce": self.feed.exactly_once, "filters": list(DRAFT_FILTERS)}

    def _parse_fetch(self, query: str) -> _Fetch:
        """Validate a fetch's query string for this dialect (400, or 409 for an old token)."""
        pairs = parse_qsl(query, keep_blank_values=True)
        params = dict(pairs)
        fetch = {"v1": self._parse_v1, "draft": self._parse_draft, "published": self._parse_published}[self.dialect]
        return fetch(pairs, params)

    def _parse_v1(self, pairs: list[tuple[str, str]], params: dict[str, str]) -> _Fetch:
        cursors = [(key, value) for key, value in pairs if key.startswith("cursor")]
        if not cursors:
            raise _HttpError(400, "no cursors")
        if len(cursors) > 1:
            raise _HttpError(400, "exactly one cursor<i> per call is supported")
        n, count = _int_param(params.get("n"), "n"), self.feed.partition_count()
        if n != count:
            raise _HttpError(400, f"n={n} but the feed has {count} partitions")
        key, cursor = cursors[0]
        return _fetch(_int_param(key[len("cursor") :], key), cursor, params.get("pagesizehint"))

    def _parse_draft(self, pairs: list[tuple[str, str]], params: dict[str, str]) -> _Fetch:
        filters = {key[len("filter-") :]: value for key, value in pairs if key.startswith("filter-")}
        unsupported = sorted(set(filters) - set(DRAFT_FILTERS))
        if unsupported:
            raise _HttpError(400, f"unsupported filter(s): {', '.join(unsupported)}")
        fetch = _fetch(_int_param(params.get("partition"), "partition"), params.get("cursor"), params.get("pageSizeHint"))
        if "type" in filters:
            fetch.types = frozenset([filters["type"]])
        return fetch

    def _parse_published(self, pairs: list[tuple[str, str]], params: dict[str, str]) -> _Fetch:
        if "token" not in params:
            raise _HttpError(400, "missing token")
        if not hmac.compare_digest(params["token"], self.discovery_token):
            raise _HttpError(409, "token is outdated: run discovery again")
        include, skip = params.get("event-types"), params.get("skip-event-types")
        if include is not None and skip is not None:
            raise _HttpError(400, "event-types and skip-event-types are mutually exclusive")
        fetch = _fetch(_int_param(params.get("partition"), "partition"), params.get("cursor"), params.get("pagesizehint"))
        types = include if include is not None else skip
        if types is not None and not self.ignore_filters:
            fetch.types, fetch.include = frozenset(types.split(";")), include is not None
        return fetch


def _fetch(partition: int, cursor: str | None, hint: str | None) -> _Fetch:
    if cursor is None:
        raise _HttpError(400, "missing cursor")
    if cursor not in ("_first", "_last") and not _CURSOR.fullmatch(cursor):
        raise _HttpError(400, f"malformed cursor: {cursor!r}")
    limit = DEFAULT_PAGE_SIZE if hint is None else _int_param(hint, "page size hint")
    if limit < 1:
        raise _HttpError(400, "page size hint must be >= 1")
    return _Fetch(partition, cursor, min(limit, MAX_PAGE_SIZE))


def _int_param(value: str | None, name: str) -> int:
    if value is None:
        raise _HttpError(400, f"missing {name}")
    try:
        return int(value)
    except ValueError:
        raise _HttpError(400, f"{name} must be an integer, not {value!r}") from None


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


class _Handler(DemoHandler):
    server: DemoHTTPServer

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path.startswith("/admin/"):
            self._admin(url)
            return
        demo = self.server.demo
        try:
            if demo.token is not None and not hmac.compare_digest(
                self.headers.get("Authorization", ""), f"Bearer {demo.token}"
            ):
                self._send(401, b"unauthorized\n", "text/plain; charset=utf-8", (("WWW-Authenticate", "Bearer"),))
                return
            # v1 has no discovery: its argument-less GET falls through to the fetch and gets a 400
            if url.path == "/feed" and (demo.dialect == "published" or (demo.dialect == "draft" and not url.query)):
                self._send_json(200, demo._discovery())
                return
            if url.path != ("/feed/events" if demo.dialect == "published" else "/feed"):
                raise _HttpError(404, "not found")
            fetch = demo._parse_fetch(url.query)
            body = demo._page(fetch)
        except _HttpError as e:
            self._send(e.status, e.message.encode() + b"\n", "text/plain; charset=utf-8")
            return
        gate = demo.gate
        if gate is not None:
            gate.hold(fetch)
        faults = demo.faults  # read once: it may be swapped concurrently
        kind = None if faults is None else faults.pick()
        if faults is None or kind is None:
            self._send(200, body, "application/x-ndjson")
        else:
            demo.record_fault(kind)
            send_fault(self, kind, body, faults.retry_after)

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        if url.path.startswith("/admin/"):
            self._admin(url)
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    def _admin(self, url: SplitResult) -> None:
        """Drive the feed over HTTP (for the console demo). Not authenticated, never faulty."""
        demo, feed = self.server.demo, self.server.demo.feed
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        action = (self.command, url.path)
        try:
            args = json.loads(raw) if raw.strip() else {}
            if not isinstance(args, dict):
                raise ValueError("the request body must be a JSON object")
            if action == ("GET", "/admin/published"):
                result: object = feed.published(int(parse_qs(url.query)["partition"][0]))
            elif action == ("POST", "/admin/append"):
                partition = args.get("partition")
                count = int(args.get("count", 1))
                result = {"appended": len(feed.append(count, None if partition is None else int(partition)))}
            elif action == ("POST", "/admin/close"):
                feed.close(int(args["partition"]))
                result = {"closed": int(args["partition"])}
            elif action == ("POST", "/admin/split"):
                split = {1: feed.split_method1, 2: feed.split_method2}.get(args.get("method"))
                if split is None:
                    raise ValueError("method must be 1 or 2")
                result = {"children": split(int(args["partition"]), int(args.get("children", 2)))}
            elif action == ("POST", "/admin/faults"):
                demo.faults = Faults(
                    float(args.get("rate", 0.0)),
                    int(args.get("seed", 0)),
                    int(args.get("retry_after", 1)),
                    tuple(args.get("kinds", KINDS)),
                )
                result = {"rate": demo.faults.rate, "seed": demo.faults.seed, "retry_after": demo.faults.retry_after}
            elif action == ("POST", "/admin/rotate-token"):
                result = {"token": demo.rotate_token()}
            else:
                self._send_json(404, {"error": f"no admin action {self.command} {url.path}"})
                return
        except KeyError as e:
            self._send_json(400, {"error": f"missing field {e}"})
        except (ValueError, TypeError) as e:
            self._send_json(400, {"error": str(e)})
        else:
            self._send_json(200, result)
