"""A third protocol from outside the package, as a user's package would add one: "jsonlines".

A server of numbered partitions: `GET {url}/partitions` says each partition's `end` (the number of
events it holds), `GET {url}/partitions/{id}?stream=...&after=<offset>&limit=<n>` answers the events
after an offset as JSON lines `{"offset": 7, "event": {...}}`. The offset of an event is its cursor;
a read stops at the last event discovery listed. `stream` is this protocol's own setting.

Importing this module registers the protocol; nothing in `feedapi_dagster/` knows about it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Literal

from pydantic import Field

from feedapi_dagster.protocol import (
    FIRST,
    BodyReader,
    FeedInfo,
    FeedProtocol,
    FeedSettings,
    MalformedResponse,
    PageRun,
    Partition,
    ProtocolError,
    Request,
    Response,
    discovery,
    register_protocol,
)


class JsonLinesSettings(FeedSettings):
    protocol: Literal["jsonlines"] = "jsonlines"
    stream: str = Field(min_length=1, description="the server's stream to read")


class JsonLines(FeedProtocol[JsonLinesSettings]):
    name = "jsonlines"
    settings = JsonLinesSettings

    def discovery_request(self, feed: JsonLinesSettings) -> Request:
        return Request(f"{feed.url}/partitions", {"stream": feed.stream})

    def discovered(self, feed: JsonLinesSettings, response: Response | None) -> FeedInfo:
        assert response is not None
        document = discovery.document(self, feed, response, "partition listing")
        partitions, rejected = discovery.partitions(feed, document["partitions"], _partition)
        return FeedInfo(protocol=self.name, exactly_once=True, partitions=partitions, rejected=rejected)

    def fetch(self, feed: JsonLinesSettings, info: FeedInfo, partition_id: int, cursor: str) -> Request:
        after = "-1" if cursor == FIRST else cursor
        return Request(
            f"{feed.url}/partitions/{partition_id}",
            {"stream": feed.stream, "after": after, "limit": str(feed.page_size_hint)},
        )

    def reader(
        self, feed: JsonLinesSettings, info: FeedInfo, partition_id: int, cursor: str, max_page_bytes: int | None
    ) -> BodyReader:
        return _Lines(partition_id)

    def read_end(self, info: FeedInfo, partition_id: int) -> str | None:
        partition = info.partition(partition_id)
        if partition is None:
            raise ProtocolError(f"partition {partition_id} is not listed", partition=partition_id)
        return partition.last_cursor or FIRST  # FIRST: an empty partition, nothing to read


def _partition(entry: dict) -> Partition:
    end = int(entry["end"])
    return Partition(id=entry["id"], last_cursor=str(end - 1) if end else None)


class _Lines(BodyReader):
    """Each line is an event and its page (its offset the cursor); a body is one run."""

    def __init__(self, partition_id: int):
        self.partition_id = partition_id

    def runs(self, chunks: Iterable[bytes]) -> Iterator[PageRun]:
        raws: list[bytes] = []
        cursors: list[str] = []
        for line in b"".join(chunks).splitlines():
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                raws.append(json.dumps(item["event"], separators=(",", ":")).encode())
                cursors.append(str(int(item["offset"])))
            except (ValueError, KeyError, TypeError) as error:
                raise MalformedResponse(
                    f"partition {self.partition_id}: a bad line ({error})", partition=self.partition_id
                ) from None
        if cursors:
            yield PageRun(self.partition_id, raws, list(range(1, len(raws) + 1)), cursors, sum(map(len, raws)))


register_protocol(JsonLines())
