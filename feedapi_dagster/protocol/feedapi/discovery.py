"""FeedAPI's discovery document as a `FeedInfo`: the dialect (detected unless configured), the
partitions, the published dialect's token, and feedapi-go's omitted parent 0."""

from __future__ import annotations

from typing import Any

from feedapi_dagster.errors import ProtocolError

from ..discovery import partitions as accepted_partitions
from ..models import FeedInfo, Partition
from .settings import FeedApiSettings


def v1_info(feed: FeedApiSettings) -> FeedInfo:
    assert feed.partition_count is not None
    # v1 promises nothing about duplicates, so it is treated as at-least-once.
    return FeedInfo(
        protocol=feed.protocol,
        dialect="v1",
        exactly_once=False,
        partitions=[Partition(id=i) for i in range(feed.partition_count)],
    )


def parse_discovery(feed: FeedApiSettings, document: Any) -> FeedInfo:
    url = feed.safe_url
    if not isinstance(document, dict) or not isinstance(document.get("partitions"), list):
        raise ProtocolError(f"feed {url}: discovery document has no 'partitions' list")
    token = document.get("token")
    if token is not None and not isinstance(token, str):
        raise ProtocolError(f"feed {url}: discovery 'token' must be a string")
    dialect = feed.dialect if feed.dialect != "auto" else ("published" if token is not None else "draft")
    if dialect == "published" and token is None:
        raise ProtocolError(f"feed {url}: dialect 'published' forced, but discovery has no token")
    partitions, rejected = accepted_partitions(feed, document["partitions"], Partition.model_validate)
    if dialect == "published":
        partitions = _infer_go_parent_zero(partitions)
    return FeedInfo(
        protocol=feed.protocol,
        dialect=dialect,
        exactly_once=document.get("exactlyOnce") is True,
        partitions=partitions,
        token=token,
        stream=dialect == "draft" and document.get("stream") is True,  # the published revision removed it
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
        if p.id != 0 and p.starts_after is None and not p.cursor_from
        else p
        for p in partitions
    ]
