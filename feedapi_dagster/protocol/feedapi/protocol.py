"""FeedAPI (v1/ZeroEventHub, the v2 draft, the published v2) as a `FeedProtocol`.

Discovery (`discovery.py`; the dialect is detected unless configured), the dialects' fetch requests
(`dialects.py`), NDJSON bodies of events and checkpoints (`ndjson.py`; their lines: `lines.py`), the
published dialect's client-side event-type filter (`filters.py`) and its 409 (the discovery token
changed).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import replace
from itertools import accumulate

import msgspec

from feedapi_dagster.errors import ProtocolError, RediscoveryNeeded

from .. import discovery
from ..interface import BodyReader, FeedProtocol, Request, Response
from ..models import FeedInfo, PageRun
from .dialects import DIALECTS, DRAFT
from .discovery import parse_discovery, v1_info
from .filters import EventFilter
from .ndjson import PageReader
from .settings import FeedApiSettings

log = logging.getLogger(__name__)


class FeedApi(FeedProtocol[FeedApiSettings]):
    name = "feedapi"
    settings = FeedApiSettings

    def discovery_request(self, feed: FeedApiSettings) -> Request | None:
        return None if feed.dialect == "v1" else Request(feed.url)

    def discovered(self, feed: FeedApiSettings, response: Response | None) -> FeedInfo:
        if response is None:
            info = v1_info(feed)
        elif response.status == 400 and feed.dialect == "auto":
            if feed.partition_count is None:
                raise ProtocolError(
                    f"feed {feed.safe_url}: discovery answered 400, so the server speaks v1 "
                    "(ZeroEventHub), which has no discovery: configure partition_count",
                    status=400,
                )
            info = v1_info(feed)
        else:
            info = parse_discovery(feed, discovery.document(self, feed, response, "discovery"))
        if feed.stream_ms is not None and not info.stream:
            # a setting for servers that offer it: the same feed still loads, by pages
            log.warning(
                "feed %s: stream_ms is set, but discovery does not offer `stream` (dialect %s): paging",
                feed.safe_url,
                info.dialect,
            )
        return info

    def fetch(self, feed: FeedApiSettings, info: FeedInfo, partition_id: int, cursor: str) -> Request:
        return DIALECTS[_dialect(info)].fetch(feed, partition_id, cursor, info.token)

    def stream_ms(self, feed: FeedApiSettings, info: FeedInfo) -> int | None:
        return feed.stream_ms if info.stream and info.dialect == "draft" else None

    def stream_fetch(
        self, feed: FeedApiSettings, info: FeedInfo, partition_id: int, cursor: str, duration_ms: int
    ) -> Request:
        return DRAFT.stream_fetch(feed, partition_id, cursor, duration_ms)

    def reader(
        self, feed: FeedApiSettings, info: FeedInfo, partition_id: int, cursor: str, max_page_bytes: int | None
    ) -> BodyReader:
        dialect = _dialect(info)
        return _Body(
            PageReader(partition_id, DIALECTS[dialect].event_key, max_page_bytes),
            feed.filters if dialect == "published" else None,
        )

    def read_end(self, info: FeedInfo, partition_id: int) -> str | None:
        partition = info.partition(partition_id)
        if partition is None and info.dialect != "v1":
            raise ProtocolError(f"partition {partition_id} is not in discovery", partition=partition_id)
        return partition.last_cursor if partition is not None and partition.closed else None

    def refusal(self, feed: FeedApiSettings, response: Response, partition: int | None, what: str) -> ProtocolError:
        if response.status == 409 and partition is not None:
            return RediscoveryNeeded(
                f"feed {feed.safe_url}: partition {partition}: the discovery token changed (409); run discovery again",
                status=409,
                partition=partition,
            )
        return super().refusal(feed, response, partition, what)


def _dialect(info: FeedInfo) -> str:
    if info.dialect not in DIALECTS:
        raise ProtocolError(f"a FeedAPI discovery without a dialect ({info.dialect!r})")
    return info.dialect


class _Body(BodyReader):
    """FeedAPI NDJSON; a published server may ignore the event-type filter, so it is applied again."""

    def __init__(self, pages: PageReader, filters: EventFilter | None):
        self.pages = pages
        self.filters = filters

    def runs(self, chunks: Iterable[bytes]) -> Iterator[PageRun]:
        for run in self.pages.runs(chunks):
            yield run if self.filters is None else self._filtered(run, self.filters)

    @staticmethod
    def _filtered(run: PageRun, filters: EventFilter) -> PageRun:
        pages = [[raw for raw in page.raw_events if filters.keeps(msgspec.json.decode(raw))] for page in run.pages()]
        raws = [raw for page in pages for raw in page]
        return replace(run, raw_events=raws, ends=list(accumulate(map(len, pages))), payload_bytes=sum(map(len, raws)))
