"""FeedAPI (v1/ZeroEventHub, the v2 draft, the published v2) as a `FeedProtocol`.

Discovery (the dialect is detected unless configured), the dialects' fetch requests
(`dialects.py`), NDJSON bodies of events and checkpoints (`ndjson.py`), the published dialect's
client-side event-type filter and its 409 (the discovery token changed).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import replace
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import msgspec
import requests
from pydantic import ValidationError

from .base import BodyReader, FeedProtocol, FetchRequest
from .dialects import DIALECTS
from feedapi_dagster.errors import ProtocolError, RediscoveryNeeded
from .models import FeedInfo, PageRun, Partition
from .ndjson import PageReader

if TYPE_CHECKING:
    from .client import FeedClient
    from .feed import Feed

log = logging.getLogger(__name__)


class FeedApi(FeedProtocol):
    name = "feedapi"
    event_id_field = "id"

    def check(self, feed: "Feed") -> None:
        if feed.dialect == "v1" and feed.partition_count is None:
            raise ValueError("dialect v1 needs partition_count (v1 has no discovery)")
        if feed.event_type is not None:
            raise ValueError("event_type is a Nakadi setting (protocol: nakadi)")

    def discover(self, client: "FeedClient") -> FeedInfo:
        feed = client.feed
        if feed.dialect == "v1":
            return _v1_info(feed)
        response = client.get(feed.url, {}, partition=None, what="discovery")
        with response:
            status = response.status_code
            if status == 400:
                if feed.dialect != "auto":
                    raise self.status_error(client, response, None, "discovery")
                if feed.partition_count is None:
                    raise ProtocolError(
                        f"feed {client.safe_url}: discovery answered 400, so the server speaks v1 "
                        "(ZeroEventHub), which has no discovery: configure partition_count",
                        status=400,
                    )
                return _v1_info(feed)
            if status != 200:
                raise self.status_error(client, response, None, "discovery")
            try:
                document = response.json()
            except ValueError as error:
                raise ProtocolError(f"feed {client.safe_url}: discovery response is not JSON") from error
        return _parse_discovery(client, document)

    def fetch(self, feed: "Feed", info: FeedInfo, partition_id: int, cursor: str) -> FetchRequest:
        return DIALECTS[info.dialect].fetch(feed, partition_id, cursor, info.token)

    def reader(self, feed: "Feed", info: FeedInfo, partition_id: int, max_page_bytes: int | None) -> BodyReader:
        return _Body(PageReader(partition_id, DIALECTS[info.dialect].event_key, max_page_bytes),
                     feed.filters if info.dialect == "published" else None)

    def read_end(self, info: FeedInfo, partition_id: int) -> str | None:
        partition = info.partition(partition_id)
        if partition is None and info.dialect != "v1":
            raise ProtocolError(f"partition {partition_id} is not in discovery", partition=partition_id)
        return partition.last_cursor if partition is not None and partition.closed else None

    def status_error(self, client: "FeedClient", response: requests.Response, partition: int | None,
                     what: str) -> ProtocolError:
        if response.status_code == 409 and partition is not None:
            return RediscoveryNeeded(
                f"feed {client.safe_url}: partition {partition}: the discovery token changed (409); "
                "run discovery again", status=409, partition=partition)
        return super().status_error(client, response, partition, what)


class _Body(BodyReader):
    """FeedAPI NDJSON; a published server may ignore the event-type filter, so it is applied again."""

    def __init__(self, pages: PageReader, filters):
        self.pages = pages
        self.filters = filters

    def runs(self, chunks: Iterable[bytes]) -> Iterator[PageRun]:
        for run in self.pages.runs(chunks):
            yield run if self.filters is None else self._filtered(run)

    def _filtered(self, run: PageRun) -> PageRun:
        pages = [[raw for raw in page.raw_events if self.filters.keeps(msgspec.json.decode(raw))]
                 for page in run.pages()]
        raws = [raw for page in pages for raw in page]
        return replace(run, raw_events=raws, ends=list(accumulate(map(len, pages))), payload_bytes=sum(map(len, raws)))


def _v1_info(feed: "Feed") -> FeedInfo:
    assert feed.partition_count is not None
    # v1 promises nothing about duplicates, so it is treated as at-least-once.
    return FeedInfo(dialect="v1", exactly_once=False,
                    partitions=[Partition(id=i) for i in range(feed.partition_count)])


def _parse_discovery(client: "FeedClient", document: Any) -> FeedInfo:
    feed, url = client.feed, client.safe_url
    if not isinstance(document, dict) or not isinstance(document.get("partitions"), list):
        raise ProtocolError(f"feed {url}: discovery document has no 'partitions' list")
    token = document.get("token")
    if token is not None and not isinstance(token, str):
        raise ProtocolError(f"feed {url}: discovery 'token' must be a string")
    dialect = feed.dialect if feed.dialect != "auto" else ("published" if token is not None else "draft")
    if dialect == "published" and token is None:
        raise ProtocolError(f"feed {url}: dialect 'published' forced, but discovery has no token")
    partitions: list[Partition] = []
    rejected: list[str] = []
    for entry in document["partitions"]:
        try:
            partitions.append(Partition.model_validate(entry))
        except ValidationError as error:
            reasons = "; ".join(e["msg"].removeprefix("Value error, ") for e in error.errors())
            rejected.append(f"partition entry {str(entry)[:120]} rejected: {reasons}")
    for message in rejected:
        log.error("feed %s: %s", url, message)
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
