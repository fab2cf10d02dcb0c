"""What a protocol's `BodyReader` can count on: one reader per attempt of a fetch, made for the cursor
that attempt reads after (a body cut mid-way by a proxy is read on by a new reader, from the last
good cursor), and `JsonDocumentReader` for answers that are one JSON document."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs, urlsplit

import pytest

from feedapi_dagster.protocol import (
    FIRST,
    BodyReader,
    FeedClient,
    FeedInfo,
    FeedProtocol,
    FeedSettings,
    JsonDocumentReader,
    MalformedResponse,
    PageRun,
    Partition,
    RawJson,
    Request,
    RetryPolicy,
    feed_settings,
    register_protocol,
    registry,
)
from tests.cutting_proxy import Cut, CuttingProxy

from .conftest import LocalServer

EVENTS = 22
LIMIT = 8


class CountedSettings(FeedSettings):
    protocol: Literal["counted"] = "counted"


class Counted(FeedProtocol[CountedSettings]):
    """A server that pages by counting: `GET {url}/{partition}?after=N&limit=L` answers the events
    after the N-th as NDJSON, one event a line, without ids or offsets. A cursor is the number of
    events read: only a reader that knows where its answer starts can tell the cursor of a line."""

    name = "counted"
    settings = CountedSettings

    def discovery_request(self, feed: CountedSettings) -> None:
        return None

    def discovered(self, feed: CountedSettings, response: object) -> FeedInfo:
        return FeedInfo(protocol=self.name, exactly_once=True, partitions=[Partition(id=0)])

    def fetch(self, feed: CountedSettings, info: FeedInfo, partition_id: int, cursor: str) -> Request:
        after = "0" if cursor == FIRST else cursor
        return Request(f"{feed.url}/{partition_id}", {"after": after, "limit": str(feed.page_size_hint)})

    def reader(
        self, feed: CountedSettings, info: FeedInfo, partition_id: int, cursor: str, max_page_bytes: int | None
    ) -> BodyReader:
        return _CountedLines(partition_id, 0 if cursor == FIRST else int(cursor), feed.page_size_hint)


class _CountedLines(BodyReader):
    """Each block of complete lines is a run of one page; a body of fewer lines than asked for says
    the partition is caught up."""

    def __init__(self, partition_id: int, after: int, limit: int):
        self.partition_id = partition_id
        self.after = after
        self.limit = limit

    def runs(self, chunks: Iterable[bytes]) -> Iterator[PageRun]:
        pending, read = b"", 0
        for chunk in chunks:
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            events = [line for line in lines if line.strip()]
            if events:
                read += len(events)
                yield PageRun.of_pages(self.partition_id, [(events, str(self.after + read))])
        if pending.strip():
            raise MalformedResponse("the body ends in an incomplete line", partition=self.partition_id)
        self.caught_up = read < self.limit


@dataclass
class CountedServer:
    """The `Counted` server of one partition of `EVENTS` events, on 127.0.0.1; `afters` records the
    `after` of each fetch."""

    afters: list[str]

    def __enter__(self) -> CountedServer:
        self._server = LocalServer(self._handle)
        self.url = self._server.url
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.close()

    def _handle(self, handler) -> None:
        query = {key: values[0] for key, values in parse_qs(urlsplit(handler.path).query).items()}
        self.afters.append(query["after"])
        after, limit = int(query["after"]), int(query["limit"])
        body = b"".join(json.dumps({"n": n}).encode() + b"\n" for n in range(after + 1, min(after + limit, EVENTS) + 1))
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


@pytest.fixture
def registered(monkeypatch):
    """Registers this file's protocols for the test only (the registry is the process's)."""
    monkeypatch.setattr(registry, "_PROTOCOLS", dict(registry._PROTOCOLS))
    register_protocol(Counted())


def test_an_answer_cut_mid_body_is_read_on_by_a_new_reader_from_the_last_good_cursor(registered):
    with CountedServer([]) as server, CuttingProxy(server.url, Cut(lambda path, status: True, times=1)) as proxy:
        retry = RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.01)
        client = FeedClient(feed_settings(url=proxy.url, protocol="counted", page_size_hint=LIMIT, retry=retry))
        runs = list(client.page_runs(0))
    events = [json.loads(raw)["n"] for run in runs for raw in run.raw_events]
    assert events == list(range(1, EVENTS + 1))  # each once: a resumed answer's cursors count from its start
    assert [run.cursor for run in runs][-1] == str(EVENTS)
    cut_after = runs[0].cursor  # the lines before the cut
    assert 0 < int(cut_after) < LIMIT
    # the cut answer, the rest from the last good cursor, then pages until one says caught up: no fetch after
    assert server.afters == ["0", *map(str, range(int(cut_after), EVENTS + 1, LIMIT))]


@dataclass
class OrdersAnswer:
    events: list[RawJson]
    more: bool


class _Orders(JsonDocumentReader[OrdersAnswer]):
    """An answer `{"events": [...], "more": false}` of one page, its cursor given by the test."""

    def __init__(self, max_page_bytes: int | None = None):
        super().__init__(OrdersAnswer, 3, max_page_bytes)

    def read(self, document: OrdersAnswer) -> Iterator[PageRun]:
        self.caught_up = not document.more
        yield PageRun.of_pages(self.partition_id, [(document.events, "c")])


def test_a_json_document_is_decoded_once_whole_and_its_events_keep_the_servers_bytes():
    body = b'{"more": false, "events": [{"id": "a",  "x": [1, 2]}, {"id":"b","s":"\\u00e9"}]}'
    reader = _Orders()
    (run,) = reader.runs([body[:7], body[7:40], body[40:]])  # chunks cut anywhere
    assert run.raw_events == [b'{"id": "a",  "x": [1, 2]}', b'{"id":"b","s":"\\u00e9"}']
    assert (run.partition_id, run.ends, run.cursors, run.payload_bytes) == (3, [2], ["c"], 48)
    assert reader.caught_up


@pytest.mark.parametrize(
    ("body", "bound", "message"),
    [
        (
            b'{"events": [{"id": "a"}], "more": tr',
            None,
            r"partition 3: the answer is not JSON \(Input data was truncated\)",
        ),
        (
            b'{"events": {"id": "a"}, "more": true}',
            None,
            r"not the document expected: Expected `array`, got `object` - at `\$.events`",
        ),
        (b'{"events": [], "more": true}', 10, "partition 3: an answer of more than 10 bytes"),
    ],
)
def test_a_json_document_that_is_cut_not_json_of_another_shape_or_too_large_is_malformed(body, bound, message):
    with pytest.raises(MalformedResponse, match=message) as raised:
        list(_Orders(bound).runs([body]))
    assert raised.value.partition == 3
