"""`FeedClient`: discovery and paged reading of one feed, in any protocol (`interface.FeedProtocol`).

The only part of `protocol/` that speaks HTTP: it sends the requests a protocol builds and hands it
the responses (`interface.Response`, a body's chunks)."""

from __future__ import annotations

import logging
import math
import re
import select
import ssl
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager, closing
from dataclasses import replace
from functools import partial
from urllib.parse import urlsplit

import requests
import urllib3

from feedapi_dagster.errors import MalformedResponse, ProtocolError

from .interface import BodyReader, FeedProtocol, Request, Response
from .models import FIRST, FeedInfo, PageRun
from .registry import protocol_of
from .retry import TRANSIENT_STATUSES
from .settings import FeedSettings, redact_url

log = logging.getLogger(__name__)

_CHUNK_BYTES = 256 * 1024
_REFUSAL_BYTES = 64 * 1024  # of a refused response's body, what its protocol reads to explain it
# urllib3's errors: a body read from the raw response (`_body_chunks`) is not wrapped by requests
_TRANSPORT_ERRORS = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
    urllib3.exceptions.HTTPError,
)
# credentials in a URL an error quotes (`scheme://user:password@host`)
_USERINFO = re.compile(r"//[^/@\s]*@")


class FeedClient(AbstractContextManager["FeedClient"]):
    """Reads one feed. One HTTP session per client, so connections are reused across pages.

    The bearer token is sent in the Authorization header only and kept out of reprs, logs and errors.
    Proxies (`HTTPS_PROXY`, `NO_PROXY`...) and a CA bundle (`REQUESTS_CA_BUNDLE`) are taken from the
    environment when the client is made; `~/.netrc` is not used.
    """

    def __init__(
        self,
        feed: FeedSettings,
        *,
        timeout: tuple[float, float] = (10.0, 60.0),
        max_page_bytes: int | None = 256 * 1024 * 1024,
        info: FeedInfo | None = None,
        label: str | None = None,
    ):
        """`info`: a discovery made before (by whoever planned the read), used until a 409 asks for a
        new one; None: discover on first use. `label`: how an unset token variable's error names the
        feed (`feed 'orders'`; its URL by default)."""
        parts = urlsplit(feed.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ProtocolError(f"feed URL must be an http or https URL, got {redact_url(feed.url)!r}")
        self.feed = feed
        self.timeout = timeout
        self.max_page_bytes = max_page_bytes
        self.protocol: FeedProtocol = protocol_of(feed)
        self._token = token = feed.bearer_token(label)
        self._session = requests.Session()
        # requests looks up proxies and CA bundles in the environment at every request (~0.3 ms of
        # Python each, a thousand requests per million events): look them up once, for this feed's URL
        environment = self._session.merge_environment_settings(feed.url, {}, None, feed.tls_verify(), None)
        self._session.proxies.update(environment["proxies"])
        self._session.verify = environment["verify"]
        self._session.trust_env = False
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"
        self._info: FeedInfo | None = info

    def __repr__(self) -> str:
        return f"FeedClient({redact_url(self.feed.url)!r}, protocol={self.feed.protocol!r})"

    def close(self) -> None:
        self._session.close()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def info(self) -> FeedInfo:
        """The last discovery result (discovering first if needed)."""
        return self._info or self.discover()

    # ---------------------------------------------------------------- discovery
    def discover(self) -> FeedInfo:
        request = self.protocol.discovery_request(self.feed)
        answer = None if request is None else self._whole_answer(request, "discovery")
        self._info = self.protocol.discovered(self.feed, answer)
        return self._info

    # ---------------------------------------------------------------- declared schema
    def declared_columns(self) -> dict[str, str]:
        """The payloads' top-level fields whose types the server declares, each as a Spark SQL DDL type
        (`FeedProtocol.declared_columns`); {} where the protocol asks for none. Raises `ProtocolError`
        for a refused or unreadable answer, or when retries run out."""
        request = self.protocol.schema_request(self.feed)
        if request is None:
            return {}
        return self.protocol.declared_columns(self.feed, self._whole_answer(request, "schema"))

    def _whole_answer(self, request: Request, what: str) -> Response:
        """The answer to `request` (one JSON document, `what` in errors), its body read whole: retried
        as any request, and asked for again when its body was cut short."""
        answer, attempt = None, 0
        while answer is None:
            response, attempt = self._request(
                lambda: (request, self.timeout), partition=None, what=what, first_attempt=attempt + 1
            )
            with response:
                answer = self._read(response, None, attempt, None, what)
        return answer

    # ---------------------------------------------------------------- paging
    def page_runs(self, partition_id: int, cursor: str = FIRST) -> Iterator[PageRun]:
        """The pages of `partition_id` after `cursor` until the partition is caught up, a response
        body's worth at a time (`PageRun.pages()` gives them one by one).

        Each page's events are covered by its cursor. Cursor-only pages are yielded too, so that a
        filtered feed still advances. A transient failure mid-body resumes from the last yielded
        cursor; a 409 raises `RediscoveryNeeded`.

        Where the protocol streams (`FeedProtocol.stream_ms`), the read is one fetch kept open that
        long: its pages come as the server publishes them, and the read ends when the time is up.
        """
        info = self.info
        try:
            end_cursor = self.protocol.read_end(info, partition_id)
        except ProtocolError as error:
            raise ProtocolError(f"feed {self.safe_url}: {error}", partition=partition_id) from None
        stream_ms = self.protocol.stream_ms(self.feed, info)
        deadline = None if stream_ms is None else time.monotonic() + stream_ms / 1000
        while cursor != end_cursor:
            advanced = False
            reader: list[BodyReader] = []  # the reader of the fetch's last attempt, which read it to its end
            with closing(self._fetch(reader, info, partition_id, cursor, deadline)) as runs:
                for fetched in runs:
                    run = self._progress(fetched, cursor)
                    if run is None:
                        continue
                    yield run
                    if run.done:
                        return
                    advanced = True
                    cursor = run.cursor
                    if cursor == end_cursor:
                        return
            if deadline is not None or not advanced or reader[0].caught_up:
                return

    def _progress(self, run: PageRun, cursor: str) -> PageRun | None:
        """`run` from resume point `cursor`, without the pages that neither add events nor move the
        cursor, and with the last resume point as a `_done` page's cursor; None if nothing is left."""
        if run.done:
            run = replace(run, cursors=[*run.cursors[:-1], run.cursors[-2] if len(run.cursors) > 1 else cursor])
        last = len(run.ends) - 1
        kept = [
            index
            for index, (start, end, page_cursor, before) in enumerate(
                zip([0, *run.ends[:-1]], run.ends, run.cursors, [cursor, *run.cursors[:-1]], strict=True)
            )
            if start != end or page_cursor != before or (run.done and index == last)
        ]
        if not kept:
            return None
        if len(kept) < len(run.ends):  # no-op pages hold no events: only their ends and cursors go
            run = replace(run, ends=[run.ends[index] for index in kept], cursors=[run.cursors[index] for index in kept])
        return run

    def _fetch(
        self, reader: list[BodyReader], info: FeedInfo, partition_id: int, cursor: str, deadline: float | None
    ) -> Generator[PageRun, None, None]:
        """One logical fetch from `cursor`, retried (from the last good cursor) until it completes; a
        stream (until `deadline`, monotonic) completes at its deadline: one that ends before, cleanly
        or not, was cut (an API gateway closing long requests, a server's own limit) and goes on, unless
        it ended cleanly with nothing new (a closed partition drained: asking again would spin).

        Each attempt's body is read by a reader of its own, made for the cursor it reads after, and
        held in `reader` (a list of one, for the caller) in place of the one before: what a reader
        holds (a partial line, `caught_up`, where its answer starts) is of one body, never of a body
        cut before."""
        attempt = 0
        while True:
            attempt += 1
            requested = cursor
            response, attempt = self._request(
                partial(self._fetch_request, info, partition_id, cursor, deadline),
                partition=partition_id,
                what="fetch",
                first_attempt=attempt,
            )
            with response:
                if response.status_code != 200:
                    refused = self._read(response, _REFUSAL_BYTES, attempt, partition_id, "fetch")
                    if refused is None:
                        continue
                    raise self.protocol.refusal(self.feed, refused, partition_id, "fetch")
                reader[:] = [self.protocol.reader(self.feed, info, partition_id, cursor, self.max_page_bytes)]
                try:
                    for run in reader[0].runs(_body_chunks(response)):
                        yield run
                        if run.done:
                            return
                        cursor = run.cursor
                        attempt = 0  # a checkpoint came: the server is well (a stream's keep-alive too)
                    if deadline is None or time.monotonic() >= deadline or cursor == requested:
                        return
                    ended = f"the stream ended {deadline - time.monotonic():.1f}s before its time"
                    self._wait_or_raise(max(attempt, 1), partition_id, ended, None, None)
                except MalformedResponse as error:
                    self._wait_or_raise(max(attempt, 1), partition_id, _describe(error), None, error)
                except _TRANSPORT_ERRORS as error:
                    self._wait_or_raise(
                        max(attempt, 1), partition_id, _cut_short("fetch", response, error), None, error
                    )

    def _fetch_request(
        self, info: FeedInfo, partition_id: int, cursor: str, deadline: float | None
    ) -> tuple[Request, tuple[float, float]]:
        """The fetch from `cursor` and its timeouts. A stream asks for the time left until `deadline`,
        and waits for bytes up to that long plus the read timeout: a stream may be quiet (no event, no
        checkpoint) for all its duration, as the spec asks no keep-alive of a server."""
        if deadline is None:
            return self.protocol.fetch(self.feed, info, partition_id, cursor), self.timeout
        left = max(deadline - time.monotonic(), 0.001)
        request = self.protocol.stream_fetch(self.feed, info, partition_id, cursor, math.ceil(left * 1000))
        return request, (self.timeout[0], self.timeout[1] + left)

    # ---------------------------------------------------------------- HTTP with retries
    def _request(
        self,
        build: Callable[[], tuple[Request, tuple[float, float]]],
        *,
        partition: int | None,
        what: str,
        first_attempt: int = 1,
    ) -> tuple[requests.Response, int]:
        """GET the request `build` makes (with its timeouts; made again for each attempt: a stream asks
        for the time left) with retries on transport errors and transient statuses: the first other
        response (a streamed one: close it), and the attempts spent so far (a fetch that failed mid-body
        goes on counting)."""
        attempt = first_attempt
        while True:
            request, timeout = build()
            try:
                response = self._session.get(
                    request.url,
                    params=request.params,
                    headers=request.headers or None,
                    stream=True,
                    timeout=timeout,
                )
            except _TRANSPORT_ERRORS as error:
                self._wait_or_raise(attempt, partition, f"{what}: {_describe(error)}", None, error)
                attempt += 1
                continue
            except requests.RequestException as error:  # no retry mends it: a redirect loop, a bad URL
                raise ProtocolError(
                    f"{self._where(partition)}: {what}: {_describe(error)}", partition=partition
                ) from error
            if response.status_code not in TRANSIENT_STATUSES:
                return response, attempt
            retry_after = response.headers.get("Retry-After")
            response.close()
            self._wait_or_raise(attempt, partition, f"{what}: HTTP {response.status_code}", retry_after, None)
            attempt += 1

    def _wait_or_raise(
        self, attempt: int, partition: int | None, reason: str, retry_after: str | None, error: BaseException | None
    ) -> None:
        where = self._where(partition)
        if attempt >= self.feed.retry.max_attempts:
            raise ProtocolError(
                f"{where}: giving up after {attempt} attempts: {reason}", partition=partition
            ) from error
        delay = self.feed.retry.delay(attempt, retry_after)
        log.warning("%s: %s; retry %d/%d in %.2fs", where, reason, attempt, self.feed.retry.max_attempts - 1, delay)
        time.sleep(delay)

    def _where(self, partition: int | None) -> str:
        return f"feed {self.safe_url}" + (f" partition {partition}" if partition is not None else "")

    def _read(
        self, response: requests.Response, limit: int | None, attempt: int, partition: int | None, what: str
    ) -> Response | None:
        """`response` as its protocol reads it (`_response`), or None when its body was cut short (a
        proxy dropped the connection): after the wait before attempt `attempt + 1`, or raising when it
        was the last. A cut body is retried as a failed request is: discovery and a refusal's
        explanation come whole, or as one `ProtocolError` saying what was cut."""
        try:
            return self._response(response, limit)
        except _TRANSPORT_ERRORS as error:
            self._wait_or_raise(attempt, partition, _cut_short(what, response, error), None, error)
            return None

    def _response(self, response: requests.Response, limit: int | None) -> Response:
        """`response` as its protocol reads it (the body, or its first `limit` bytes), without the token:
        a server that echoes the request must not put it into an error."""
        body = response.content if limit is None else response.raw.read(limit, decode_content=True)
        if self._token:
            body = body.replace(self._token.encode(), b"***")
        return Response(response.status_code, dict(response.headers), body)

    @property
    def safe_url(self) -> str:
        return self.feed.safe_url


def _body_chunks(response: requests.Response) -> Iterator[bytes]:
    """The body's bytes (content-decoded) as they arrive, at most about `_CHUNK_BYTES` at a time.

    `iter_content` reads a body that has a Content-Length or ends with the connection until it holds
    `_CHUNK_BYTES` (or the body ends): a slow page or an open stream would be held back. `read1`
    returns what one read of the socket gives (a chunked body: what its next chunk holds), so lines
    are handed on as soon as they come, and memory stays bounded by the chunk size. Of a body without
    chunks, what has arrived already is read on into the same chunk: a large page comes in a few
    socket reads, and a chunk per read would double the runs (and the work per run) of a bulk load. A
    chunked body (Nakadi's stream, a FeedAPI stream) comes a chunk at a time, as `iter_content` gave
    it: its server's batches are the runs, which a load's per-partition bound stops after.
    """
    raw = response.raw
    # urllib3 copies what it decodes through a buffer: only an encoded body (gzip...) is worth it
    decode = bool(raw.headers.get("Content-Encoding"))
    while chunk := raw.read1(_CHUNK_BYTES, decode_content=decode):
        if len(chunk) < _CHUNK_BYTES and not raw.chunked and _arrived(raw):
            parts, size = [chunk], len(chunk)
            while size < _CHUNK_BYTES and _arrived(raw) and (more := raw.read1(_CHUNK_BYTES - size, decode)):
                parts.append(more)
                size += len(more)
            chunk = b"".join(parts)
        yield chunk


def _arrived(raw: urllib3.BaseHTTPResponse) -> bool:
    """Whether bytes of the response wait on its socket, so that reading them does not wait."""
    connection = raw.connection if isinstance(raw, urllib3.HTTPResponse) else None
    sock = None if connection is None else connection.sock
    if sock is None:
        return False
    if isinstance(sock, ssl.SSLSocket) and sock.pending():  # decrypted already, invisible to select
        return True
    return bool(select.select([sock], [], [], 0)[0])


def _cut_short(what: str, response: requests.Response, error: BaseException) -> str:
    """What failed when the body of `response` (to the request `what`) broke off."""
    return f"{what}: the answer (HTTP {response.status_code}) was cut short: {_describe(error)}"


def _describe(error: BaseException) -> str:
    """`error` in one line, without the credentials a URL in it may hold (`requests` quotes the URL it
    could not parse). Of a connection that failed, urllib3's reason (`Failed to establish a new
    connection: [Errno 111] Connection refused`), not the retries' wrapping around it, which quotes
    the whole URL first and left the reason past the cut."""
    wrapped = error.args[0] if error.args else None
    reason = getattr(wrapped, "reason", None)  # requests' ConnectionError holds urllib3's MaxRetryError
    text = str(reason if isinstance(reason, BaseException) else error)
    return f"{type(error).__name__}: {_USERINFO.sub('//', ' '.join(text.split()))[:300]}"
