"""`JsonDocumentReader`: a `BodyReader` for answers that are one JSON document (`{"events": [...],
"next": ...}`), not lines: the body is collected whole and decoded once, by msgspec, into the type the
protocol says; the protocol then makes the document's `PageRun`s.

Such a body yields nothing until it has all come: one cut short is read again from the same cursor.
The events keep the bytes the server sent where the type says `RawJson` (msgspec validates them as
JSON and copies nothing), as a page's events must (`Page.raw_events`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

import msgspec

from feedapi_dagster.errors import MalformedResponse

from .interface import BodyReader
from .models import PageRun

# The raw JSON of a value in a document, as the server sent it (`bytes(raw)` gives its bytes).
RawJson = msgspec.Raw

Document = TypeVar("Document")


class JsonDocumentReader(BodyReader, Generic[Document]):
    """Reads a body that is one JSON document of `document_type` (a dataclass, a `TypedDict`, a
    `msgspec.Struct`, `dict`...: what msgspec decodes) into `PageRun`s of `partition_id`, through
    `read`. A body of more than `max_page_bytes` bytes, not JSON, or not of that type is a
    `MalformedResponse` (retried as a cut one is)."""

    def __init__(self, document_type: type[Document], partition_id: int, max_page_bytes: int | None):
        # msgspec keeps what it learnt of a type on the type: a decoder per reader costs microseconds
        self._decoder = msgspec.json.Decoder(document_type)
        self.partition_id = partition_id
        self.max_page_bytes = max_page_bytes

    def read(self, document: Document) -> Iterator[PageRun]:
        """The runs of the decoded answer; sets `caught_up` where the answer says there is no more now."""
        raise NotImplementedError

    def runs(self, chunks: Iterable[bytes]) -> Iterator[PageRun]:
        parts: list[bytes] = []
        size = 0
        for chunk in chunks:
            size += len(chunk)
            if self.max_page_bytes is not None and size > self.max_page_bytes:
                raise self.malformed(f"an answer of more than {self.max_page_bytes} bytes")
            parts.append(chunk)
        body = b"".join(parts)
        try:
            document = self._decoder.decode(body)
        except msgspec.ValidationError as error:
            raise self.malformed(f"the answer is not the document expected: {error}") from None
        except (msgspec.DecodeError, RecursionError) as error:
            raise self.malformed(f"the answer is not JSON ({error}): {body[:80]!r}") from None
        yield from self.read(document)

    def malformed(self, reason: str) -> MalformedResponse:
        """The error of an answer that is not the protocol's, naming the partition."""
        return MalformedResponse(f"partition {self.partition_id}: {reason}", partition=self.partition_id)
