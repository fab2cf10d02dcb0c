"""Streaming reader of FeedAPI NDJSON bodies.

The reader turns byte chunks, however they were cut, into `Page`s: the events between two
checkpoints plus the cursor of the second. It never holds more than one page and one partial
line, has no line-length cap, and yields a page only once its checkpoint has arrived, so events
after the last checkpoint of a body are never handed out (they come back on the next fetch).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from json.decoder import scanstring
from typing import Any

from .errors import MalformedResponse
from .models import DONE_CURSORS, Event, Page, PayloadKind

_DECODER = json.JSONDecoder()
_scan_value = _DECODER.scan_once  # C scanner: (string, index) -> (value, end index)
_WHITESPACE = " \t\r\n"
_KIND_BY_FIRST_CHAR: dict[str, PayloadKind] = {"{": "object", '"': "string", "[": "array", "t": "boolean",
                                                "f": "boolean", "n": "null"}


class LineParser:
    """Parses one NDJSON line into ("event", Event) / ("cursor", str) / None for commands to ignore."""

    def __init__(self, event_key: str):
        self.event_key = event_key
        # The common shape `{"<event_key>":<payload>}` is recognised by its prefix so that the payload
        # is scanned once, without walking keys.
        self._fast_prefix = '{"%s":' % event_key

    def parse(self, text: str) -> tuple[str, Any] | None:
        if text.startswith(self._fast_prefix):
            start = _skip_ws(text, len(self._fast_prefix))
            value, end = self._scan(text, start)
            if end == len(text) - 1 and text[end] == "}":
                return "event", _event(text, start, end, value)
        fields = self._fields(text)
        if self.event_key in fields:
            value, start, end = fields[self.event_key]
            return "event", _event(text, start, end, value)
        if "cursor" in fields:
            cursor = fields["cursor"][0]
            if isinstance(cursor, int) and not isinstance(cursor, bool):
                cursor = str(cursor)
            if not isinstance(cursor, str):
                raise MalformedResponse(f"checkpoint cursor must be a string, got {type(cursor).__name__}")
            return "cursor", cursor
        return None  # a command from a future protocol revision

    def _scan(self, text: str, index: int) -> tuple[Any, int]:
        try:
            return _scan_value(text, index)
        except (StopIteration, ValueError) as error:
            raise MalformedResponse(f"line is not valid JSON: {_excerpt(text)}") from error

    def _fields(self, text: str) -> dict[str, tuple[Any, int, int]]:
        """Top-level keys of a JSON object line with their values and raw spans."""
        length = len(text)
        index = _skip_ws(text, 0)
        if index >= length or text[index] != "{":
            raise MalformedResponse(f"line is not a JSON object: {_excerpt(text)}")
        index = _skip_ws(text, index + 1)
        fields: dict[str, tuple[Any, int, int]] = {}
        if index < length and text[index] == "}":
            return self._expect_end(text, index + 1, fields)
        while True:
            if index >= length or text[index] != '"':
                raise MalformedResponse(f"line is not valid JSON: {_excerpt(text)}")
            try:
                key, index = scanstring(text, index + 1)
            except ValueError as error:
                raise MalformedResponse(f"line is not valid JSON: {_excerpt(text)}") from error
            index = _skip_ws(text, index)
            if index >= length or text[index] != ":":
                raise MalformedResponse(f"line is not valid JSON: {_excerpt(text)}")
            start = _skip_ws(text, index + 1)
            value, end = self._scan(text, start)
            fields[key] = (value, start, end)
            index = _skip_ws(text, end)
            if index < length and text[index] == ",":
                index = _skip_ws(text, index + 1)
                continue
            if index < length and text[index] == "}":
                return self._expect_end(text, index + 1, fields)
            raise MalformedResponse(f"line is not valid JSON: {_excerpt(text)}")

    @staticmethod
    def _expect_end(text: str, index: int, fields: dict) -> dict:
        if _skip_ws(text, index) != len(text):
            raise MalformedResponse(f"line has trailing data: {_excerpt(text)}")
        return fields


def _event(text: str, start: int, end: int, value: Any) -> Event:
    kind = _KIND_BY_FIRST_CHAR.get(text[start], "number")
    return Event(raw=value if kind == "string" else text[start:end], kind=kind, value=value)


def _skip_ws(text: str, index: int) -> int:
    length = len(text)
    while index < length and text[index] in _WHITESPACE:
        index += 1
    return index


def _excerpt(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


def iter_lines(chunks: Iterable[bytes], max_line_bytes: int | None = None) -> Iterator[tuple[bytes, bool]]:
    """Split byte chunks on b"\\n" only. Yields (line, terminated); the last line may be unterminated."""
    pending = b""
    for chunk in chunks:
        if not chunk:
            continue
        if pending:
            chunk = pending + chunk
        lines = chunk.split(b"\n")
        pending = lines.pop()
        for line in lines:
            yield line, True
        if max_line_bytes is not None and len(pending) > max_line_bytes:
            raise MalformedResponse(f"a line exceeds the limit of {max_line_bytes} bytes")
    if pending:
        yield pending, False


def read_pages(
    chunks: Iterable[bytes],
    partition_id: int,
    parser: LineParser,
    max_page_bytes: int | None = None,
) -> Iterator[Page]:
    """Pages of one response body.

    Raises `MalformedResponse` when the body is damaged (invalid UTF-8, a line that is not JSON, an
    unterminated last line that is not JSON: a cut-short body or a server's junk trailer), after the
    pages that complete checkpoints before the damage cover have been yielded.
    """
    records: list[Event] = []
    page_bytes = 0
    for raw_line, terminated in iter_lines(chunks, max_page_bytes):
        if raw_line.endswith(b"\r"):
            raw_line = raw_line[:-1]
        if not raw_line.strip():
            continue
        try:
            text = raw_line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise MalformedResponse(f"partition {partition_id}: body is not valid UTF-8", partition=partition_id) from error
        try:
            parsed = parser.parse(text)
        except MalformedResponse as error:
            reason = "body ends in an incomplete or junk line" if not terminated else str(error)
            raise MalformedResponse(f"partition {partition_id}: {reason}", partition=partition_id) from error
        if parsed is None:
            continue
        what, item = parsed
        if what == "event":
            records.append(item)
            if max_page_bytes is not None:
                page_bytes += len(raw_line)
                if page_bytes > max_page_bytes:
                    raise MalformedResponse(
                        f"partition {partition_id}: more than {max_page_bytes} bytes of events without a checkpoint",
                        partition=partition_id,
                    )
            continue
        if item in DONE_CURSORS:
            yield Page(partition_id, records, cursor="", done=True)
            return
        yield Page(partition_id, records, cursor=item)
        records = []
        page_bytes = 0
