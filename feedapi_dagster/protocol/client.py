"""`FeedClient`: discovery and paged reading of one FeedAPI feed, in any dialect."""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from itertools import accumulate
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import msgspec
import requests
from pydantic import ValidationError

from .dialects import DIALECTS, DialectSpec
from .errors import FeedAPIError, MalformedResponse, RediscoveryNeeded
from .feed import Feed, redact_url
from .models import FIRST, FeedInfo, Page, PageRun, Partition
from .ndjson import PageReader
from .retry import TRANSIENT_STATUSES

log = logging.getLogger(__name__)

_CHUNK_BYTES = 256 * 1024
_TRANSPORT_ERRORS = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)


class FeedClient:
    """Reads one feed. One HTTP session per client, so connections are reused across pages.

    The bearer token is sent in the Authorization header only and kept out of reprs, logs and errors.
    Proxies (`HTTPS_PROXY`, `NO_PROXY`...) and a CA bundle (`REQUESTS_CA_BUNDLE`) are taken from the
    environment when the client is made; `~/.netrc` is not used.
    """

    def __init__(
        self,
        feed: Feed,
        *,
        timeout: tuple[float, float] = (10.0, 60.0),
        max_page_bytes: int | None = 256 * 1024 * 1024,
        info: FeedInfo | None = None,
    ):
        """`info`: a discovery made before (by whoever planned the read), used until a 409 asks for a
        new one; None: discover on first use."""
        parts = urlsplit(feed.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise FeedAPIError(f"feed URL must be an http or https URL, got {redact_url(feed.url)!r}")
        self.feed = feed
        self.timeout = timeout
        self.max_page_bytes = max_page_bytes
        self._token = token = feed.bearer_token()
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
        return f"FeedClient({redact_url(self.feed.url)!r}, dialect={self.feed.dialect!r})"

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> "FeedClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def info(self) -> FeedInfo:
        """The last discovery result (discovering first if needed)."""
        return self._info or self.discover()

    # ---------------------------------------------------------------- discovery
    def discover(self) -> FeedInfo:
        if self.feed.dialect == "v1":
            self._info = self._v1_info()
            return self._info
        response, _ = self._request(self.feed.url, {}, partition=None, what="discovery")
        with response:
            status = response.status_code
            if status == 400:
                if self.feed.dialect != "auto":
                    raise self._status_error(response, None, "discovery")
                if self.feed.partition_count is None:
                    raise FeedAPIError(
                        f"feed {self._safe_url}: discovery answered 400, so the server speaks v1 "
                        "(ZeroEventHub), which has no discovery: configure partition_count",
                        status=400,
                    )
                self._info = self._v1_info()
                return self._info
            if status != 200:
                raise self._status_error(response, None, "discovery")
            try:
                document = response.json()
            except ValueError as error:
                raise FeedAPIError(f"feed {self._safe_url}: discovery response is not JSON") from error
        self._info = self._parse_discovery(document)
        return self._info

    def _v1_info(self) -> FeedInfo:
        assert self.feed.partition_count is not None
        # v1 promises nothing about duplicates, so it is treated as at-least-once.
        return FeedInfo(dialect="v1", exactly_once=False,
                        partitions=[Partition(id=i) for i in range(self.feed.partition_count)])

    def _parse_discovery(self, document: Any) -> FeedInfo:
        if not isinstance(document, dict) or not isinstance(document.get("partitions"), list):
            raise FeedAPIError(f"feed {self._safe_url}: discovery document has no 'partitions' list")
        token = document.get("token")
        if token is not None and not isinstance(token, str):
            raise FeedAPIError(f"feed {self._safe_url}: discovery 'token' must be a string")
        dialect = self.feed.dialect if self.feed.dialect != "auto" else ("published" if token is not None else "draft")
        if dialect == "published" and token is None:
            raise FeedAPIError(f"feed {self._safe_url}: dialect 'published' forced, but discovery has no token")
        partitions: list[Partition] = []
        rejected: list[str] = []
        for entry in document["partitions"]:
            try:
                partitions.append(Partition.model_validate(entry))
            except ValidationError as error:
                reasons = "; ".join(e["msg"].removeprefix("Value error, ") for e in error.errors())
                rejected.append(f"partition entry {str(entry)[:120]} rejected: {reasons}")
        for message in rejected:
            log.error("feed %s: %s", self._safe_url, message)
        if dialect == "published":
            partitions = _infer_go_parent_zero(partitions)
        filters = document.get("filters") or []
        return FeedInfo(
            dialect=dialect,
            exactly_once=document.get("exactlyOnce") is True,
            partitions=partitions,
            token=token,
            filters=[str(f) for f in filters] if isinstance(filters, list) else [],
            rejected=rejected,
        )

    # ---------------------------------------------------------------- paging
    def pages(self, partition_id: int, cursor: str = FIRST) -> Iterator[Page]:
        """Pages of `partition_id` after `cursor`, until the partition is caught up.

        Each page's events are covered by its cursor. Cursor-only pages are yielded too, so that a
        filtered feed still advances. A transient failure mid-body resumes from the last yielded
        cursor; a 409 raises `RediscoveryNeeded`.
        """
        for run in self.page_runs(partition_id, cursor):
            yield from run.pages()

    def page_runs(self, partition_id: int, cursor: str = FIRST) -> Iterator[PageRun]:
        """The pages of `pages()`, a response body's worth at a time."""
        info = self.info
        spec = DIALECTS[info.dialect]
        partition = info.partition(partition_id)
        if partition is None and info.dialect != "v1":
            raise FeedAPIError(f"feed {self._safe_url}: partition {partition_id} is not in discovery",
                               partition=partition_id)
        end_cursor = partition.last_cursor if partition is not None and partition.closed else None
        while True:
            advanced = False
            for run in self._fetch(spec, info, partition_id, cursor):
                run = self._progress(run, cursor)
                if run is None:
                    continue
                yield run
                if run.done:
                    return
                advanced = True
                cursor = run.cursor
            if not advanced or (end_cursor is not None and cursor == end_cursor):
                return

    def _progress(self, run: PageRun, cursor: str) -> PageRun | None:
        """`run` from resume point `cursor`, filtered, without the pages that neither add events nor move
        the cursor, and with the last resume point as a `_done` page's cursor; None if nothing is left."""
        if run.done:
            run = replace(run, cursors=[*run.cursors[:-1], run.cursors[-2] if len(run.cursors) > 1 else cursor])
        last = len(run.ends) - 1
        kept = [index for index, (start, end, page_cursor, before)
                in enumerate(zip([0, *run.ends[:-1]], run.ends, run.cursors, [cursor, *run.cursors[:-1]]))
                if start != end or page_cursor != before or (run.done and index == last)]
        if not kept:
            return None
        if len(kept) < len(run.ends):  # no-op pages hold no events: only their ends and cursors go
            run = replace(run, ends=[run.ends[index] for index in kept], cursors=[run.cursors[index] for index in kept])
        return self._filtered(run)

    def _filtered(self, run: PageRun) -> PageRun:
        if self.feed.filters is None or self.info.dialect != "published":
            return run
        pages = [[raw for raw in page.raw_events if self.feed.filters.keeps(msgspec.json.decode(raw))]
                 for page in run.pages()]
        raws = [raw for page in pages for raw in page]
        return replace(run, raw_events=raws, ends=list(accumulate(map(len, pages))), payload_bytes=sum(map(len, raws)))

    def _fetch(self, spec: DialectSpec, info: FeedInfo, partition_id: int, cursor: str) -> Iterator[PageRun]:
        """One logical fetch from `cursor`, retried (from the last good cursor) until it completes."""
        reader = PageReader(partition_id, spec.event_key, self.max_page_bytes)
        attempt = 0
        while True:
            attempt += 1
            request = spec.fetch(self.feed, partition_id, cursor, info.token)
            response, attempt = self._request(request.url, request.params, partition=partition_id,
                                              what="fetch", first_attempt=attempt)
            with response:
                status = response.status_code
                if status == 200:
                    try:
                        for run in reader.runs(response.iter_content(_CHUNK_BYTES)):
                            yield run
                            if not run.done:
                                cursor = run.cursor
                            attempt = 0
                        return
                    except (MalformedResponse, *_TRANSPORT_ERRORS) as error:
                        self._wait_or_raise(max(attempt, 1), partition_id, _describe(error), None, error)
                        continue
                if status == 409:
                    raise RediscoveryNeeded(
                        f"feed {self._safe_url}: partition {partition_id}: the discovery token changed (409); "
                        "run discovery again", status=409, partition=partition_id)
                raise self._status_error(response, partition_id, "fetch")

    # ---------------------------------------------------------------- HTTP with retries
    def _request(self, url: str, params: dict[str, str], *, partition: int | None, what: str,
                 first_attempt: int = 1) -> tuple[requests.Response, int]:
        """GET with retries on transport errors and transient statuses.

        Returns the first other response and the number of attempts spent so far.
        """
        attempt = first_attempt
        while True:
            try:
                response = self._session.get(url, params=params, stream=True, timeout=self.timeout)
            except _TRANSPORT_ERRORS as error:
                self._wait_or_raise(attempt, partition, f"{what}: {_describe(error)}", None, error)
                attempt += 1
                continue
            if response.status_code not in TRANSIENT_STATUSES:
                return response, attempt
            retry_after = response.headers.get("Retry-After")
            response.close()
            self._wait_or_raise(attempt, partition, f"{what}: HTTP {response.status_code}", retry_after, None)
            attempt += 1

    def _wait_or_raise(self, attempt: int, partition: int | None, reason: str, retry_after: str | None,
                       error: BaseException | None) -> None:
        where = f"feed {self._safe_url}" + (f" partition {partition}" if partition is not None else "")
        if attempt >= self.feed.retry.max_attempts:
            raise FeedAPIError(f"{where}: giving up after {attempt} attempts: {reason}",
                               partition=partition) from error
        delay = self.feed.retry.delay(attempt, retry_after)
        log.warning("%s: %s; retry %d/%d in %.2fs", where, reason, attempt, self.feed.retry.max_attempts - 1, delay)
        time.sleep(delay)

    def _status_error(self, response: requests.Response, partition: int | None, what: str) -> FeedAPIError:
        status = response.status_code
        body = self._redact(response.text[:500].strip())
        where = f"feed {self._safe_url}" + (f" partition {partition}" if partition is not None else "")
        if status in (401, 403):
            hint = "the token was refused" if self._token else "the server wants a bearer token"
            return FeedAPIError(f"{where}: {what} not authorized (HTTP {status}): {hint}: {body}",
                                status=status, partition=partition)
        return FeedAPIError(f"{where}: {what} failed (HTTP {status}): {body}", status=status, partition=partition)

    def _redact(self, text: str) -> str:
        return text.replace(self._token, "***") if self._token else text

    @property
    def _safe_url(self) -> str:
        return redact_url(self.feed.url)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error)[:200]}"


def _infer_go_parent_zero(partitions: list[Partition]) -> list[Partition]:
    """feedapi-go omits `startsAfterPartition` when the parent is partition 0 (Go's omitempty on 0).

    When partition 0 is closed, a partition without any split field may be one of its method-1
    children; treating it as such only delays it until 0 is drained, while the opposite guess
    would break the order of 0's aggregates.
    """
    zero = next((p for p in partitions if p.id == 0), None)
    if zero is None or not zero.closed:
        return partitions
    return [
        p.model_copy(update={"starts_after": 0, "starts_after_inferred": True})
        if p.id != 0 and p.starts_after is None and not p.cursor_from else p
        for p in partitions
    ]
