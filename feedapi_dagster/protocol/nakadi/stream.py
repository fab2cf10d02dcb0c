"""Nakadi's event stream of one partition (NDJSON `EventStreamBatch`es) as `PageRun`s."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgspec

from feedapi_dagster.errors import MalformedResponse

from ..interface import BodyReader
from ..models import PageRun
from .offsets import reached


class _Cursor(msgspec.Struct, gc=False):
    partition: str
    offset: str


class _Batch(msgspec.Struct, gc=False):
    cursor: _Cursor
    events: list[msgspec.Raw] = []


_BATCHES = msgspec.json.Decoder(list[_Batch])
_BATCH = msgspec.json.Decoder(_Batch)


class EventStream(BodyReader):
    """One partition's `EventStreamBatch`es: each block of complete lines is one `PageRun` (a batch a
    page), decoded in one go; the read ends at `end` or at a keep-alive batch."""

    def __init__(self, partition_id: int, end: str | None, max_page_bytes: int | None):
        self.partition_id = partition_id
        self.end = end
        self.max_page_bytes = max_page_bytes

    def runs(self, chunks: Iterable[bytes]) -> Iterator[PageRun]:
        pending = b""
        for chunk in chunks:
            pending += chunk
            cut = pending.rfind(b"\n")
            if cut < 0:
                self._check_bound(len(pending))
                continue
            block, pending = pending[: cut + 1], pending[cut + 1 :]
            run, damage = self._run(block)
            if run is not None:
                yield run
            if self.caught_up:
                return
            if damage is not None:
                raise damage
        if pending.strip():
            raise self._damage("the stream ends in an incomplete line (cut short)")

    def _run(self, block: bytes) -> tuple[PageRun | None, MalformedResponse | None]:
        lines = [line for line in block.split(b"\n") if line.strip()]
        try:
            batches = _BATCHES.decode(b"[" + b",".join(lines) + b"]")
            damage = None
        except (msgspec.DecodeError, UnicodeDecodeError):
            batches, damage = self._good_prefix(lines)
        raws: list[bytes] = []
        ends: list[int] = []
        cursors: list[str] = []
        for batch in batches:
            if batch.cursor.partition != str(self.partition_id):
                raise self._damage(f"a batch of partition {batch.cursor.partition!r} in its stream")
            if not batch.events:  # a keep-alive: nothing more for now
                self.caught_up = True
                break
            raws.extend(map(bytes, batch.events))
            ends.append(len(raws))
            cursors.append(batch.cursor.offset)
            if self.end is not None and reached(batch.cursor.offset, self.end):
                self.caught_up = True
                break
        if self.max_page_bytes is not None and any(map(self.max_page_bytes.__lt__, map(len, lines))):
            raise self._damage(f"a batch of more than {self.max_page_bytes} bytes")
        run = PageRun(self.partition_id, raws, ends, cursors, sum(map(len, raws))) if cursors else None
        return run, damage

    def _good_prefix(self, lines: list[bytes]) -> tuple[list[_Batch], MalformedResponse]:
        """The batches before the first damaged line, and the damage (raised once they are yielded: the
        client then asks again from their cursor)."""
        batches = []
        for line in lines:
            try:
                batches.append(_BATCH.decode(line))
            except (msgspec.DecodeError, UnicodeDecodeError) as error:
                return batches, self._damage(f"a line is not an EventStreamBatch ({error}): {line[:80]!r}")
        raise AssertionError("a block that failed to decode has a line that fails")

    def _check_bound(self, size: int) -> None:
        if self.max_page_bytes is not None and size > self.max_page_bytes:
            raise self._damage(f"a batch of more than {self.max_page_bytes} bytes")

    def _damage(self, reason: str) -> MalformedResponse:
        return MalformedResponse(f"partition {self.partition_id}: {reason}", partition=self.partition_id)
