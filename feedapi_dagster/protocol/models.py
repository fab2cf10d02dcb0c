"""Typed views of what a feed server says, the same for every protocol: its partitions (a FeedAPI
discovery document, Nakadi's partition list), events and pages."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

MAX_PARTITION_ID = 32767
# Cursor values that mean "this partition is finished"; never a resume point.
DONE_CURSORS = frozenset({"", "_done"})
# The cursor of a partition never read: a protocol's fetch after it asks for the partition's first event.
FIRST = "_first"


def _as_partition_id(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"partition id must be an integer, got {value!r}")
    if isinstance(value, str):
        if not value.strip().lstrip("-").isdigit():
            raise ValueError(f"partition id must be an integer, got {value!r}")
        value = int(value)
    if not isinstance(value, int):
        raise ValueError(f"partition id must be an integer, got {value!r}")
    if not 0 <= value <= MAX_PARTITION_ID:
        raise ValueError(f"partition id {value} is outside 0..{MAX_PARTITION_ID}")
    return value


class Partition(BaseModel):
    """One entry of the discovery document's `partitions` list."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    id: int
    closed: bool = False
    starts_after: int | None = Field(
        default=None, validation_alias=AliasChoices("startsAfterPartition", "startsAfterParent", "starts_after")
    )
    cursor_from: list[int] = Field(
        default_factory=list,
        validation_alias=AliasChoices("cursorFromPartitions", "splitFromAncestors", "cursor_from"),
    )
    last_cursor: str | None = Field(default=None, validation_alias=AliasChoices("lastCursor", "last_cursor"))
    # True when `starts_after` was not sent but inferred (see FeedInfo parsing for the Go server quirk).
    starts_after_inferred: bool = False
    # The oldest event the server still holds (Nakadi's `oldest_available_offset`): retention drops
    # older ones, read or not. None: the protocol keeps everything.
    oldest_available: str | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _id(cls, value: Any) -> int:
        return _as_partition_id(value)

    @field_validator("starts_after", mode="before")
    @classmethod
    def _starts_after(cls, value: Any) -> int | None:
        return None if value is None or value == "" else _as_partition_id(value)

    @field_validator("cursor_from", mode="before")
    @classmethod
    def _cursor_from(cls, value: Any) -> list[int]:
        if value is None:
            return []
        if isinstance(value, (str, int)):
            value = [value]
        return [_as_partition_id(v) for v in value]

    @field_validator("closed", mode="before")
    @classmethod
    def _closed(cls, value: Any) -> bool:
        return bool(value) if value is not None else False


class FeedInfo(BaseModel):
    """The result of discovery, normalised across dialects."""

    model_config = ConfigDict(frozen=True)

    protocol: str  # the registered name of the protocol that discovered it
    exactly_once: bool
    partitions: list[Partition]
    # the variant of its protocol the server speaks, for protocols that have several (FeedAPI's dialect)
    dialect: str | None = None
    token: str | None = None
    # the server takes fetches that stay open and send events as they are published (the FeedAPI
    # draft's `stream` flag): `FeedProtocol.stream_ms`
    stream: bool = False
    # Partitions the server listed but that could not be accepted (e.g. id out of range), one message each.
    rejected: list[str] = Field(default_factory=list)

    def partition(self, partition_id: int) -> Partition | None:
        return next((p for p in self.partitions if p.id == partition_id), None)

    def only(self, partition_ids: Iterable[int]) -> FeedInfo:
        """This discovery with only the given partitions (what a read of them needs to be handed)."""
        wanted = set(partition_ids)
        return self.model_copy(update={"partitions": [p for p in self.partitions if p.id in wanted]})


@dataclass(frozen=True, slots=True)
class Page:
    """Events covered by one checkpoint, and the cursor to resume after them.

    `raw_events` holds each payload's JSON text exactly as the server sent it (UTF-8 `bytes`, validated
    JSON, never re-serialised). `done` marks a checkpoint of `""`/`"_done"`: the partition is finished;
    the client then sets `cursor` to the last real resume point.
    """

    partition_id: int
    raw_events: list[bytes]
    cursor: str
    done: bool = False


@dataclass(frozen=True, slots=True)
class PageRun:
    """Consecutive pages of one partition, those that one block of a response body completed: all
    their events, and where each page ends and its cursor. A feed may checkpoint every few events, so
    readers with work per page (a load) do it once per run; `pages()` gives the pages one by one.

    `raw_events` holds the payloads of all the run's pages, one after the other, as `Page.raw_events`
    does. `ends[i]` is the number of events up to page i's checkpoint. With `done`, the last page
    finished the partition and its cursor is the last real resume point (as for `Page.done`).
    `payload_bytes` is the size of all `raw_events` (known from the scan; summing it again would touch
    every payload).
    """

    partition_id: int
    raw_events: list[bytes]
    ends: list[int]
    cursors: list[str]
    payload_bytes: int
    done: bool = False

    @classmethod
    def of_pages(
        cls, partition_id: int, pages: Iterable[tuple[Sequence[bytes | msgspec.Raw], str]], done: bool = False
    ) -> PageRun:
        """The run of `pages`, each its events' payloads (raw JSON as the server sent it: `bytes`, or
        the `msgspec.Raw` of a decoded document) and its cursor."""
        raws: list[bytes] = []
        ends: list[int] = []
        cursors: list[str] = []
        for events, cursor in pages:
            raws.extend(map(bytes, events))
            ends.append(len(raws))
            cursors.append(cursor)
        return cls(partition_id, raws, ends, cursors, sum(map(len, raws)), done)

    @property
    def cursor(self) -> str:
        return self.cursors[-1]

    def pages(self) -> Iterator[Page]:
        start, last = 0, len(self.ends) - 1
        for index, (end, cursor) in enumerate(zip(self.ends, self.cursors, strict=True)):
            yield Page(self.partition_id, self.raw_events[start:end], cursor, done=self.done and index == last)
            start = end
