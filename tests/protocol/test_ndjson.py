"""The page reader: chunking never matters, only checkpointed events come out, damage is detected."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedapi_dagster.errors import MalformedResponse
from feedapi_dagster.protocol.feedapi.ndjson import PageReader

from .conftest import payloads as decoded


def pages_read(reader, chunks):
    """The pages of `reader.runs`, one by one."""
    for run in reader.runs(chunks):
        yield from run.pages()


def read_pages(chunks, partition_id=0, max_page_bytes=None):
    return pages_read(PageReader(partition_id, "event", max_page_bytes), chunks)


payloads = st.one_of(
    st.text(max_size=30),
    st.dictionaries(
        st.text(max_size=8),
        st.one_of(
            st.integers(),
            st.text(max_size=10),
            st.floats(allow_nan=False, allow_infinity=False),
            st.lists(st.integers(), max_size=3),
        ),
        max_size=4,
    ),
)
# A body is a list of lines: ("event", payload) | ("cursor", str) | ("command", {...})
line_items = st.one_of(
    st.tuples(st.just("event"), payloads),
    st.tuples(st.just("cursor"), st.text(alphabet="abcdef0123456789", min_size=1, max_size=12)),
    st.tuples(st.just("command"), st.just({"resync": True})),
    st.tuples(st.just("blank"), st.sampled_from(["", " ", "\r"])),
)


def render(items, crlf=False) -> bytes:
    out = []
    for kind, value in items:
        if kind == "event":
            out.append(json.dumps({"event": value}, ensure_ascii=False))
        elif kind == "cursor":
            out.append(json.dumps({"cursor": value}))
        elif kind == "command":
            out.append(json.dumps(value))
        else:
            out.append(value)
    eol = "\r\n" if crlf else "\n"
    return eol.join(out).encode() + eol.encode()


def expected_pages(items):
    pages, pending = [], []
    for kind, value in items:
        if kind == "event":
            pending.append(value)
        elif kind == "cursor":
            pages.append((pending, value))
            pending = []
    return pages  # events after the last cursor are dropped


def as_tuples(pages):
    return [(decoded(page), page.cursor) for page in pages]


def split_at(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(body)) for c in cuts})
    chunks, last = [], 0
    for point in points:
        chunks.append(body[last:point])
        last = point
    chunks.append(body[last:])
    return chunks


@settings(max_examples=300, deadline=None)
@given(
    items=st.lists(line_items, max_size=25),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=12),
    crlf=st.booleans(),
)
def test_any_chunking_yields_the_same_pages_and_nothing_after_the_last_checkpoint(items, cuts, crlf):
    body = render(items, crlf)
    whole = as_tuples(read_pages([body], 0))
    chunked = as_tuples(read_pages(split_at(body, cuts), 0))
    assert chunked == whole == expected_pages(items)


@settings(max_examples=200, deadline=None)
@given(items=st.lists(line_items, max_size=25), cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=12))
def test_a_runs_payload_bytes_are_its_events_bytes_however_the_body_is_cut(items, cuts):
    # events carried over from earlier chunks count in the run that their checkpoint completes
    runs = list(PageReader(0, "event").runs(split_at(render(items), cuts)))
    assert [run.payload_bytes for run in runs] == [sum(map(len, run.raw_events)) for run in runs]
    assert [raw for run in runs for raw in run.raw_events] == [
        json.dumps(value, ensure_ascii=False).encode() for page, _ in expected_pages(items) for value in page
    ]


@settings(max_examples=200, deadline=None)
@given(items=st.lists(line_items, min_size=1, max_size=15), cut=st.integers(min_value=1, max_value=5000))
def test_a_body_cut_short_never_yields_more_than_complete_checkpoints_cover(items, cut):
    body = render(items)
    cut = min(cut, len(body) - 1)
    truncated = body[:cut]
    pages = []
    try:
        for page in read_pages([truncated], 0):
            pages.append(page)
    except MalformedResponse:
        pass
    got = as_tuples(pages)
    assert got == expected_pages(items)[: len(got)]


def test_raw_payload_text_is_kept_byte_for_byte():
    body = '{"event":{"b": 1.0,"a":"Gr\\u00fc\\u00dfe \\"q\\" 日本","n":{"x":[1e3]}}}\n{"cursor":"c1"}\n'
    (page,) = read_pages([body.encode()], 0)
    assert page.raw_events[0] == '{"b": 1.0,"a":"Gr\\u00fc\\u00dfe \\"q\\" 日本","n":{"x":[1e3]}}'.encode()


def test_payload_kinds_and_spacing_around_keys():
    body = (
        b'{"event":"s"}\n{ "event" : [1,2] , "extra": 1}\n{"event":3}\n{"event":true}\n{"event":null}\n{"cursor":"c"}\n'
    )
    (page,) = read_pages([body], 0)
    assert page.raw_events == [b'"s"', b"[1,2]", b"3", b"true", b"null"]


def test_long_lines_have_no_cap():
    big = "x" * (3 * 1024 * 1024)
    body = json.dumps({"event": big}).encode() + b'\n{"cursor":"c"}\n'
    (page,) = read_pages([body[i : i + 65536] for i in range(0, len(body), 65536)], 0)
    assert decoded(page) == [big]


@pytest.mark.parametrize(
    "body",
    [
        b'{"event":{"a":1}}\n{"cursor":"c1"}\n{"event":{"a":2}}\nInternal server error',
        b'{"event":{"a":1}}\n{"cursor":"c1"}\n{"event":{"a":',
        b'{"event":{"a":1}}\n{"cursor":"c1"}\n\xff\xfe\n{"cursor":"c2"}\n',
        b'{"event":{"a":1}}\n{"cursor":"c1"}\nnot json\n{"cursor":"c2"}\n',
    ],
)
def test_damaged_bodies_raise_after_the_good_pages(body):
    pages = []
    with pytest.raises(MalformedResponse, match="partition 7"):
        for page in read_pages([body], 7):
            pages.append(page)
    assert as_tuples(pages) == [([{"a": 1}], "c1")]


def test_done_cursor_finishes_the_partition():
    body = b'{"event":"a"}\n{"cursor":"_done"}\n{"event":"b"}\n{"cursor":"c9"}\n'
    pages = list(read_pages([body], 0))
    assert len(pages) == 1 and pages[0].done and decoded(pages[0]) == ["a"]


@pytest.mark.parametrize("carried", [0, 1])
def test_a_page_over_the_byte_bound_is_damage_after_the_pages_before_it(carried):
    event = b'{"event":"' + b"y" * 40 + b'"}\n'  # 42 payload bytes
    body = event + b'{"cursor":"c1"}\n' + event * 3 + b'{"cursor":"c2"}\n' + event + b'{"cursor":"c3"}\n'
    chunks = [body[: len(event) * carried], body[len(event) * carried :]] if carried else [body]
    pages = []
    with pytest.raises(MalformedResponse, match="more than 100 bytes of events without a checkpoint"):
        for page in read_pages(chunks, 0, max_page_bytes=100):
            pages.append(page)
    assert [(len(page.raw_events), page.cursor) for page in pages] == [(1, "c1")]


def test_page_byte_bound_stops_an_endless_body():
    def endless():
        while True:
            yield b'{"event":"' + b"y" * 1000 + b'"}\n'

    with pytest.raises(MalformedResponse, match="without a checkpoint"):
        for _ in read_pages(endless(), 0, max_page_bytes=100_000):
            pass


@pytest.mark.parametrize(
    "line, reason",
    [
        (b'[{"event":1}]', "expected a FeedAPI line object"),
        (b'"event"', "expected a FeedAPI line object"),
        (b'{"event":1} {"cursor":"c"}', "trailing characters"),
        (b'{"cursor":1.5}', "expected a cursor"),
        (b'{"cursor":true}', "expected a cursor"),
        (b'{"cursor":{"c":1}}', "expected a cursor"),
        (b'{"event":{"a":1,}}', "line 1"),
    ],
)
def test_lines_that_are_not_feedapi_objects_are_damage(line, reason):
    body = b'{"event":{"a":1}}\n{"cursor":"c1"}\n' + line + b'\n{"cursor":"c2"}\n'
    pages = []
    with pytest.raises(MalformedResponse, match=f"line is not a FeedAPI JSON object.*{reason}") as raised:
        for page in read_pages([body], 3):
            pages.append(page)
    assert as_tuples(pages) == [([{"a": 1}], "c1")]
    assert line[:20].decode() in str(raised.value)


def test_line_fields_are_read_as_the_protocol_says():
    body = (
        b'{"\\u0065vent":"escaped key"}\n'  # keys are compared unescaped
        b'{"event":null}\n'  # a null payload is an event
        b'{"event":"both","cursor":"ignored"}\n'  # a line with an event is an event
        b'{"cursor":null}\n'  # a command of a future revision
        b'{"resync":true,"data":1}\n'  # so is a line without event or cursor
        b'{"cursor":42}\n'
    )  # integer cursors are cursors
    (page,) = read_pages([body], 0)
    assert (decoded(page), page.cursor) == (["escaped key", None, "both"], "42")
    (page,) = pages_read(PageReader(0, "data"), [b'{"data":[1]}\n{"event":2}\n{"cursor":"c"}\n'])
    assert page.raw_events == [b"[1]"]


def test_runs_hand_the_payloads_as_a_list_of_the_bytes_sent():
    body = b'{"event":{"id":1}}\n{"event":"two"}\n{"cursor":"c1"}\n{"event":[3]}\n{"cursor":"c2"}\n'
    (run,) = list(PageReader(0, "event").runs([body[:25], body[25:]]))  # an event carried across chunks
    assert type(run.raw_events) is list and all(type(raw) is bytes for raw in run.raw_events)
    assert run.raw_events == [b'{"id":1}', b'"two"', b"[3]"] and run.payload_bytes == sum(map(len, run.raw_events))
    assert [page.raw_events for page in run.pages()] == [[b'{"id":1}', b'"two"'], [b"[3]"]]


def test_blank_lines_and_crlf_between_lines_are_skipped():
    body = b'\r\n{"event":1}\r\n\r\n  \n\t\n\x0b\n{"cursor":"c1"}\r\n\n{"event":2}\n{"cursor":"c2"}\n\n'
    pages = list(read_pages([body]))
    assert [(page.raw_events, page.cursor) for page in pages] == [([b"1"], "c1"), ([b"2"], "c2")]


@pytest.mark.parametrize(
    "lines",
    [
        [b'{"event":2},{"event":3}'],  # two values on one line
        [b'{"event":[2', b"3]}"],  # one value on two lines (a newline where a comma could be)
        [b'{"event":{"a":[2', b'3]}},{"event":4}'],  # both: as many values as lines
        [b'{"event":2}', b"", b'{"event":3} {"event":4}'],  # a blank line and two values on one line
    ],
)
def test_a_line_is_one_json_object_however_the_lines_add_up(lines):
    body = b'{"event":1}\n{"cursor":"c1"}\n' + b"\n".join(lines) + b'\n{"cursor":"c2"}\n'
    pages = []
    with pytest.raises(MalformedResponse, match="line is not a FeedAPI JSON object"):
        for page in read_pages([body]):
            pages.append(page)
    assert [(page.raw_events, page.cursor) for page in pages] == [([b"1"], "c1")]


def test_invalid_utf8_inside_a_payload_string_is_damage_after_the_good_pages():
    body = '{"event":"é"}\n{"cursor":"c1"}\n'.encode() + b'{"event":"\xe9t\xe9"}\n{"cursor":"c2"}\n'
    pages = []
    with pytest.raises(MalformedResponse, match="body is not valid UTF-8"):
        for page in read_pages([body]):
            pages.append(page)
    assert [(decoded(page), page.cursor) for page in pages] == [(["é"], "c1")]


def test_a_large_block_is_read_in_pieces_as_a_whole():
    # more than the scan's piece (1 MiB): one run, pages across the cuts, damage located in a later piece
    payload = {"id": "x" * 200, "n": "é"}
    event = json.dumps({"event": payload}, ensure_ascii=False).encode()
    lines = [b'{"cursor":"%d"}' % i if i % 7 == 6 else event for i in range(20_000)]
    body = b"\n".join(lines) + b"\n"
    assert len(body) > 3 << 20
    (run,) = PageReader(0, "event").runs([body])
    assert run.cursors == [str(i) for i in range(6, 20_000, 7)]
    assert run.ends == list(range(6, 6 * len(run.cursors) + 1, 6))
    assert run.payload_bytes == run.ends[-1] * len(json.dumps(payload, ensure_ascii=False).encode())
    chunked = read_pages([body[i : i + 65536] for i in range(0, len(body), 65536)])
    assert [(page.raw_events, page.cursor) for page in run.pages()] == [
        (page.raw_events, page.cursor) for page in chunked
    ]
    pages = []
    with pytest.raises(MalformedResponse, match=r"line is not a FeedAPI JSON object .*'\{\"event\":oops\}'"):
        for page in read_pages([body + b'{"event":oops}\n{"cursor":"end"}\n']):
            pages.append(page)
    assert len(pages) == len(run.cursors)


def test_surrogates_escaped_alone_pass_in_payloads_but_not_in_keys_or_cursors():
    # valid JSON text but no Unicode (JavaScript's JSON.stringify writes them for broken strings):
    # payloads are kept as sent, fields nobody reads are skipped; keys and cursors are decoded
    body = (
        rb'{"event":"\ud800"}'
        b"\n"
        rb'{"x":"\udc00","event":{"a":"\ud83d\ude00\ud83d"}}'
        b"\n"
        rb'{"cursor":"c1"}'
        b"\n"
    )
    (page,) = read_pages([body])
    assert page.raw_events == [rb'"\ud800"', rb'{"a":"\ud83d\ude00\ud83d"}'] and page.cursor == "c1"
    for line in [rb'{"cursor":"\ud800"}', rb'{"ev\ud800ent":1}', rb'{"event":1,"cursor":"\udfff"}']:
        with pytest.raises(MalformedResponse, match="line is not a FeedAPI JSON object"):
            list(read_pages([body + line + b'\n{"cursor":"c2"}\n']))
