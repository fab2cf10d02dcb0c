"""`feedapi_native.Payloads`, the page reader's sequence of payloads (spans of response blocks): it
must behave as the list of `bytes` it stands for, whatever it was sliced and joined from."""
import pytest
from feedapi_native import Payloads
from hypothesis import given, settings
from hypothesis import strategies as st

from feedapi_dagster.protocol.ndjson import PageReader

raw_lists = st.lists(st.binary(max_size=12), max_size=12)
indices = st.integers(min_value=-15, max_value=15)
slices = st.builds(slice, st.none() | indices, st.none() | indices, st.none() | st.sampled_from([1, 2, -1, 3]))


@settings(max_examples=300, deadline=None)
@given(first=raw_lists, second=raw_lists, cut=slices, index=indices)
def test_payloads_behave_as_the_list_of_bytes_they_hold(first, second, cut, index):
    joined = Payloads(first) + Payloads(second)
    expected = first + second
    assert len(joined) == len(expected) and list(joined) == expected and joined == expected
    assert joined.nbytes == sum(map(len, expected))
    assert list(joined[cut]) == expected[cut]
    assert joined[cut] == expected[cut]
    if -len(expected) <= index < len(expected):
        assert joined[index] == expected[index]
    else:
        with pytest.raises(IndexError):
            joined[index]
    # spans of spans: a slice of a joined slice still points at the right bytes
    assert list((joined[1:] + second)[:-1]) == (expected[1:] + second)[:-1]
    assert (joined != expected + [b"x"]) and not (joined == expected + [b"x"])


def test_the_reader_hands_payloads_that_point_into_the_response_blocks():
    body = b'{"event":{"id":1}}\n{"event":"two"}\n{"cursor":"c1"}\n{"event":[3]}\n{"cursor":"c2"}\n'
    (run,) = list(PageReader(0, "event").runs([body[:25], body[25:]]))  # an event carried across chunks
    assert isinstance(run.raw_events, Payloads)
    assert run.raw_events == [b'{"id":1}', b'"two"', b"[3]"] and run.payload_bytes == run.raw_events.nbytes
    assert [page.raw_events for page in run.pages()] == [[b'{"id":1}', b'"two"'], [b"[3]"]]


def test_only_bytes_become_payloads():
    with pytest.raises(TypeError):
        Payloads(["text"])
