"""Columns of the feed table derived from raw payloads (`EventBatch.to_arrow`, `event_ids`), against an
independent oracle: Python's json module."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedapi_dagster.read.rows import EVENT_SCHEMA, EventBatch, event_ids

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text()
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8,
)
objects = st.dictionaries(st.sampled_from(["id", "name", "ID", "x"]) | st.text(max_size=4), values, max_size=4)


def render(value, style: int) -> bytes:
    """The same value as different servers would send it: compact, spaced, ASCII-escaped."""
    if style == 0:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    if style == 1:
        return json.dumps(value, separators=(" , ", " : ")).encode()
    return json.dumps(value, ensure_ascii=False).encode()


def kind_of(value) -> str:
    return {dict: "object", str: "string", list: "array", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(objects | values, st.integers(0, 2)), min_size=1, max_size=12))
def test_columns_keep_the_bytes_sent_and_agree_with_json(items):
    raws = [render(value, style) for value, style in items]
    batch = EventBatch("id")
    batch.add(4, 10, raws, [len(raws)], ["c7"])
    table = batch.to_arrow()
    assert table.schema == EVENT_SCHEMA
    rows = table.to_pylist()
    for row, raw, (value, _) in zip(rows, raws, items, strict=True):
        assert row["payload_type"] == kind_of(value)
        # a string payload is the string itself; anything else is the text sent, byte for byte
        assert row["payload"] == (value if isinstance(value, str) else raw.decode())
        if not isinstance(value, dict) or "id" not in value:
            assert row["event_id"] is None
        elif isinstance(value["id"], str):
            assert row["event_id"] == value["id"]
        else:
            assert json.loads(row["event_id"]) == value["id"]
    assert [r["position"] for r in rows] == list(range(10, 10 + len(raws)))
    assert {(r["partition_id"], r["cursor"]) for r in rows} == {(4, "c7")}
    assert event_ids(raws, "id") == [None if r["event_id"] is None else r["event_id"].encode() for r in rows]


def test_pages_keep_their_own_cursor_and_positions():
    batch = EventBatch("key")
    batch.add(1, 0, [b'{"key":"k1"}', b'{"key":2}', b'{"other":1}'], [2, 2, 3], ["a", "b", "c"])
    batch.add(2, 5, [], [0], ["d"])
    batch.add(3, 7, [b'{"key":{"k": "}"}, "x": 1}'], [0, 1], ["e", "f"])
    rows = batch.to_arrow().to_pylist()
    assert [(r["partition_id"], r["position"], r["cursor"], r["event_id"]) for r in rows] == [
        (1, 0, "a", "k1"),
        (1, 1, "a", "2"),
        (1, 2, "c", None),
        (3, 7, "f", '{"k": "}"}'),
    ]
    assert len(batch) == 4 and batch.size == len(b'{"key":"k1"}{"key":2}{"other":1}{"key":{"k": "}"}, "x": 1}')


def test_an_empty_batch_is_an_empty_table():
    assert EventBatch().to_arrow().num_rows == 0


def test_ids_are_the_first_top_level_field_whatever_comes_before_it():
    raws = [
        b'{"a":{"id":1},"b":["id",{"id":2}],"c":"\\"id\\":3","id":"yes","id":"no"}',
        b'{ "\\u0069d" : [1, {"x": "]"}] }',
        b'{"idx":1,"ID":2}',
        b"{}",
        b'[{"id":1}]',
        b'"id"',
    ]
    assert event_ids(raws, "id") == [b"yes", b'[1, {"x": "]"}]', None, None, None, None]
    with pytest.raises(TypeError):
        event_ids(["not bytes"], "id")
