"""The Nakadi demo server over real HTTP on 127.0.0.1: partitions, streams, keep-alives, retention,
repartitioning, duplicates, Problem errors and faults."""

from __future__ import annotations

import argparse
import json
import threading
import time

import pytest
import requests

from feedapi_dagster.demo.faults import KINDS, Faults
from feedapi_dagster.demo.gate import Gate
from feedapi_dagster.demo.nakadi import (
    BEGIN,
    NakadiDemoServer,
    NakadiEventType,
    format_offset,
    parse_offset,
)
from feedapi_dagster.demo.nakadi.command import register

NAME = "demo.orders"


def events_url(server: NakadiDemoServer, name: str = NAME) -> str:
    return f"{server.url}/event-types/{name}/events"


def open_stream(
    server: NakadiDemoServer, cursors: list[dict[str, str]], headers: dict[str, str] | None = None, **params: object
) -> requests.Response:
    headers = {"X-Nakadi-Cursors": json.dumps(cursors), **(headers or {})}
    return requests.get(events_url(server), headers=headers, params=params, stream=True, timeout=10)


def read_stream(server: NakadiDemoServer, cursors: list[dict[str, str]], **params: object) -> list[tuple[dict, bytes]]:
    """(batch, raw line) of one stream, read until every streamed partition has had a keep-alive."""
    waiting = {c["partition"] for c in cursors}
    batches: list[tuple[dict, bytes]] = []
    with open_stream(server, cursors, **params) as response:
        assert response.status_code == 200, response.text
        assert response.headers["Content-Type"] == "application/x-json-stream"
        assert response.headers["Transfer-Encoding"] == "chunked"
        for line in response.iter_lines():
            assert line, "no blank lines between batches"
            batch = json.loads(line)
            batches.append((batch, line))
            if "events" not in batch:
                waiting.discard(batch["cursor"]["partition"])
                if not waiting:
                    break
    return batches


def offsets_and_events(batches: list[tuple[dict, bytes]], partition: str) -> list[tuple[str, dict]]:
    """(offset, event) of one partition's delivered events: a batch's cursor is its last event's offset."""
    out: list[tuple[str, dict]] = []
    for batch, _ in batches:
        if batch["cursor"]["partition"] != partition or "events" not in batch:
            continue
        last = parse_offset(batch["cursor"]["offset"])
        assert last is not None
        events = batch["events"]
        out += [(format_offset(last - len(events) + 1 + i), e) for i, e in enumerate(events)]
    return out


def stored(event_type: NakadiEventType, partition: int, after: str = BEGIN) -> list[tuple[str, dict]]:
    return [(offset, json.loads(data)) for offset, data in event_type.read(partition, after, 1_000_000)]


def assert_problem(response: requests.Response, status: int, *details: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body["type"] == f"https://httpstatus.es/{status}" and body["title"]
    for detail in details:
        assert detail in body["detail"], body
    return body


def test_offsets_format() -> None:
    assert format_offset(12) == "001-0001-000000000000000012"
    assert parse_offset(format_offset(12)) == 12 and parse_offset("BEGIN") is None and parse_offset("begin") is None
    assert format_offset(9) < format_offset(10) < format_offset(100)
    with pytest.raises(ValueError):
        parse_offset("12")


def test_partitions_listing() -> None:
    event_type = NakadiEventType(partitions=4, events=200, seed=1)
    with NakadiDemoServer(event_type) as server:
        partitions = f"{server.url}/event-types/{NAME}/partitions"
        response = requests.get(partitions)
        assert response.status_code == 200 and response.headers["Content-Type"] == "application/json"
        listing = response.json()
        counts = [len(event_type.read(p, BEGIN, 10_000)) for p in range(4)]
        assert listing == [
            {
                "partition": str(p),
                "oldest_available_offset": format_offset(0),
                "newest_available_offset": format_offset(n - 1),
            }
            for p, n in enumerate(counts)
        ]
        assert sum(counts) == event_type.published_count() == 200 and all(counts)

        cursors = [{"partition": "0", "offset": BEGIN}, {"partition": "1", "offset": format_offset(5)}]
        lagging = requests.get(partitions, params={"cursors": json.dumps(cursors)}).json()
        assert [p.get("unconsumed_events") for p in lagging] == [counts[0], counts[1] - 6, None, None]

        one = requests.get(f"{partitions}/2", params={"consumed_offset": format_offset(counts[2] - 1)})
        assert one.json() == {**listing[2], "unconsumed_events": 0}
        assert_problem(requests.get(f"{partitions}/9"), 404, "partition 9")
        assert_problem(requests.get(f"{server.url}/event-types/other/partitions"), 404, "other")
        bad = json.dumps([{"partition": "7", "offset": BEGIN}])
        assert_problem(requests.get(partitions, params={"cursors": bad}), 422, "partition 7")


def test_the_event_type_and_its_json_schema() -> None:
    """`GET /event-types/{name}`: the spec's `EventType`, a business event type whose JSON Schema (a
    string, as Nakadi answers it) requires exactly the fields the events carry besides Nakadi's
    `metadata`, with the bearer token's rules of the other routes."""
    token = "s3cret-Token-4711"
    event_type = NakadiEventType(partitions=2, events=40, seed=4)
    with NakadiDemoServer(event_type, token=token) as server:
        url = f"{server.url}/event-types/{NAME}"
        response = requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert response.status_code == 200 and response.headers["Content-Type"] == "application/json"
        definition = response.json()
        assert {"name", "category", "owning_application", "schema"} <= set(definition)  # the spec's required
        assert definition["name"] == NAME and definition["category"] == "business"
        assert definition["schema"]["type"] == "json_schema"
        schema = json.loads(definition["schema"]["schema"])
        kinds = {"string": str, "number": float, "integer": int}
        for _, event in stored(event_type, 0) + stored(event_type, 1):
            assert set(event) - {"metadata"} == set(schema["required"]) == set(schema["properties"])
            for field, value in event.items():
                if field != "metadata":
                    assert type(value) is kinds[schema["properties"][field]["type"]], (field, value)
        assert_problem(requests.get(url, timeout=10), 401)
        assert_problem(requests.get(url, headers={"Authorization": f"Bearer {token}x"}, timeout=10), 403)
        other = requests.get(f"{server.url}/event-types/other", headers={"Authorization": f"Bearer {token}"})
        assert_problem(other, 404, "event type other does not exist")
        assert_problem(requests.get(f"{url}/", headers={"Authorization": f"Bearer {token}"}, timeout=10), 404)


def test_stream_from_begin_in_batches_reads_every_event_once() -> None:
    event_type = NakadiEventType(partitions=2, events=300, seed=2)
    with NakadiDemoServer(event_type) as server:
        batches = read_stream(server, [{"partition": "0", "offset": BEGIN}], batch_limit=7)
    expected = stored(event_type, 0)
    assert offsets_and_events(batches, "0") == expected and len(expected) > 100
    sizes = [len(batch["events"]) for batch, _ in batches[:-1]]
    assert set(sizes[:-1]) == {7} and 1 <= sizes[-1] <= 7
    _, raw = batches[-1]
    assert raw == b'{"cursor":{"partition":"0","offset":"%s"}}' % expected[-1][0].encode()
    # the stored bytes are spliced in as they are, not re-serialised
    first_raw = batches[0][1]
    assert b'"events":[' + b",".join(data for _, data in event_type.read(0, BEGIN, 7)) + b"]}" in first_raw
    assert all(e["metadata"]["partition"] == "0" and e["metadata"]["event_type"] == NAME for _, e in expected)


def test_resume_from_a_mid_cursor() -> None:
    event_type = NakadiEventType(partitions=1, events=50, seed=3)
    with NakadiDemoServer(event_type) as server:
        cursor = format_offset(19)
        batches = read_stream(server, [{"partition": "0", "offset": cursor}], batch_limit=10)
        assert offsets_and_events(batches, "0") == stored(event_type, 0, cursor)
        assert offsets_and_events(batches, "0")[0][0] == format_offset(20)
        # a cursor at the newest event: caught up, a keep-alive repeating it
        newest = format_offset(49)
        assert [b for b, _ in read_stream(server, [{"partition": "0", "offset": newest}])] == [
            {"cursor": {"partition": "0", "offset": newest}}
        ]


def test_several_partitions_in_one_stream() -> None:
    event_type = NakadiEventType(partitions=4, events=400, seed=4)
    with NakadiDemoServer(event_type) as server:
        cursors = [
            {"partition": "3", "offset": BEGIN},
            {"partition": "1", "offset": format_offset(4)},
            {"partition": "0", "offset": BEGIN},
        ]
        batches = read_stream(server, cursors, batch_limit=25)
    assert {b["cursor"]["partition"] for b, _ in batches} == {"0", "1", "3"}
    assert offsets_and_events(batches, "3") == stored(event_type, 3)
    assert offsets_and_events(batches, "1") == stored(event_type, 1, format_offset(4))
    assert offsets_and_events(batches, "0") == stored(event_type, 0)


def test_duplicates_are_the_same_event_at_consecutive_offsets() -> None:
    event_type = NakadiEventType(partitions=3, events=300, seed=5, duplicate_ratio=0.2)
    assert event_type.published_count() > event_type.unique_count() == 300
    with NakadiDemoServer(event_type) as server:
        cursors = [{"partition": str(p), "offset": BEGIN} for p in range(3)]
        batches = read_stream(server, cursors, batch_limit=50)
    seen: dict[str, list[tuple[int, int]]] = {}
    for p in range(3):
        for offset, event in offsets_and_events(batches, str(p)):
            seen.setdefault(event["metadata"]["eid"], []).append((p, parse_offset(offset) or 0))
    assert set(seen) == event_type.expected_eids() and len(event_type.all_events()) == 300
    twice = {eid: places for eid, places in seen.items() if len(places) > 1}
    assert len(twice) == event_type.published_count() - 300 > 20
    for (p1, o1), (p2, o2) in twice.values():
        assert p1 == p2 and o2 == o1 + 1


def test_repartition_adds_empty_partitions_that_get_new_events() -> None:
    event_type = NakadiEventType(partitions=2, events=100, seed=6)
    with NakadiDemoServer(event_type) as server:
        response = requests.post(f"{server.url}/admin/repartition", json={"partitions": 4})
        assert response.json() == {"new_partitions": [2, 3]}
        listing = requests.get(f"{server.url}/event-types/{NAME}/partitions").json()
        assert listing[2:] == [
            {"partition": str(p), "oldest_available_offset": format_offset(0), "newest_available_offset": BEGIN}
            for p in (2, 3)
        ]
        # an empty partition: a keep-alive with the requested cursor
        assert [b for b, _ in read_stream(server, [{"partition": "2", "offset": BEGIN}])] == [
            {"cursor": {"partition": "2", "offset": BEGIN}}
        ]
        assert requests.post(f"{server.url}/admin/append", json={"count": 200}).status_code == 200
        cursors = [{"partition": str(p), "offset": BEGIN} for p in (2, 3)]
        batches = read_stream(server, cursors, batch_limit=100)
        for p in (2, 3):
            events = offsets_and_events(batches, str(p))
            assert events == stored(event_type, p) and events
            assert {e["metadata"]["eid"] for _, e in events} == event_type.expected_eids(p)
        assert requests.post(f"{server.url}/admin/repartition", json={"partitions": 3}).status_code == 400


def test_a_live_stream_gets_new_events_and_keep_alives() -> None:
    event_type = NakadiEventType(partitions=1, events=5, seed=7)
    with NakadiDemoServer(event_type) as server:
        with open_stream(server, [{"partition": "0", "offset": BEGIN}], batch_limit=10) as response:
            lines = response.iter_lines()
            assert len(json.loads(next(lines))["events"]) == 5
            assert json.loads(next(lines)) == {"cursor": {"partition": "0", "offset": format_offset(4)}}
            event_type.append(3)
            batch = json.loads(next(lines))
            while "events" not in batch:  # a keep-alive may come first
                batch = json.loads(next(lines))
            assert batch["cursor"]["offset"] == format_offset(7) and len(batch["events"]) == 3
        # stop does not wait for an open stream that nobody reads
        response = open_stream(server, [{"partition": "0", "offset": BEGIN}])
        started = time.monotonic()
    assert time.monotonic() - started < 2
    response.close()


def test_expire_moves_the_oldest_offset() -> None:
    event_type = NakadiEventType(partitions=2, events=200, seed=8)
    with NakadiDemoServer(event_type) as server:
        total = len(event_type.read(1, BEGIN, 1000))
        response = requests.post(f"{server.url}/admin/expire", json={"partition": 1, "keep_last": 10})
        oldest = format_offset(total - 10)
        assert response.json() == {
            "partition": "1",
            "oldest_available_offset": oldest,
            "newest_available_offset": format_offset(total - 1),
        }
        too_old = format_offset(3)
        body = assert_problem(
            open_stream(server, [{"partition": "1", "offset": too_old}]), 422, too_old, "partition 1", oldest
        )
        assert body["title"] == "Unprocessable Entity"
        # just before the oldest is fine, and so is BEGIN: both read the 10 remaining events
        just_before = format_offset(total - 11)
        for cursor in (just_before, BEGIN):
            batches = read_stream(server, [{"partition": "1", "offset": cursor}], batch_limit=4)
            events = offsets_and_events(batches, "1")
            assert [o for o, _ in events] == [format_offset(n) for n in range(total - 10, total)]
        everything = [json.loads(data)["metadata"] for data in event_type.all_events().values()]
        assert event_type.expected_eids(1) == {m["eid"] for m in everything if m["partition"] == "1"}  # expired too
        # everything expired: still the same offsets, and newest stays the last event's
        event_type.expire(1, 0)
        assert event_type.partition(1) == {
            "partition": "1",
            "oldest_available_offset": format_offset(total),
            "newest_available_offset": format_offset(total - 1),
        }
        keep_alive = read_stream(server, [{"partition": "1", "offset": BEGIN}])
        assert [b for b, _ in keep_alive] == [{"cursor": {"partition": "1", "offset": BEGIN}}]


def test_request_errors_are_problems() -> None:
    event_type = NakadiEventType(partitions=2, events=10, seed=9)
    with NakadiDemoServer(event_type) as server:
        assert_problem(requests.get(events_url(server)), 400, "X-Nakadi-Cursors")
        begin = [{"partition": "0", "offset": BEGIN}]
        assert_problem(requests.get(events_url(server), headers={"X-Nakadi-Cursors": "[{"}), 422, "JSON")
        assert_problem(open_stream(server, [{"partition": "5", "offset": BEGIN}]), 422, "partition 5")
        assert_problem(open_stream(server, [{"partition": "0", "offset": "12"}]), 422, "malformed offset")
        assert_problem(open_stream(server, [{"partition": "0", "offset": format_offset(500)}]), 422, "newest")
        assert_problem(open_stream(server, begin, batch_limit=5, stream_limit=2), 422, "stream_limit")
        assert_problem(open_stream(server, begin, stream_timeout=1), 422, "batch_flush_timeout")
        assert_problem(open_stream(server, begin, batch_limit="x"), 400, "batch_limit")
        assert_problem(requests.get(events_url(server, "nope"), headers={"X-Nakadi-Cursors": json.dumps(begin)}), 404)


def test_auth_problems_do_not_echo_the_token() -> None:
    token = "s3cret-Token-4711"
    event_type = NakadiEventType(partitions=1, events=10, seed=10)
    with NakadiDemoServer(event_type, token=token) as server:
        partitions = f"{server.url}/event-types/{NAME}/partitions"
        missing = requests.get(partitions)
        assert assert_problem(missing, 401)["title"] == "Unauthorized"
        assert missing.headers["WWW-Authenticate"] == "Bearer"
        wrong_token = token + "x"
        wrong = {"Authorization": f"Bearer {wrong_token}"}
        for response in (
            requests.get(partitions, headers=wrong),
            open_stream(server, [{"partition": "0", "offset": BEGIN}], headers=wrong),
        ):
            assert assert_problem(response, 403)["title"] == "Forbidden"
            assert token not in response.text
        assert_problem(requests.get(partitions, headers={"Authorization": f"Basic {token}"}), 401)
        assert token not in missing.text
        assert requests.get(partitions, headers={"Authorization": f"Bearer {token}"}).status_code == 200
        # the admin endpoints are not authenticated
        assert requests.get(f"{server.url}/admin/stats").json()["unique"] == 10


@pytest.mark.parametrize("kind", KINDS)
def test_each_fault_kind(kind: str) -> None:
    event_type = NakadiEventType(partitions=1, events=40, seed=11)
    expected = stored(event_type, 0)
    with NakadiDemoServer(event_type, faults=Faults(1.0, kinds=(kind,), retry_after=3)) as server:
        # the partitions endpoint is never faulty
        assert requests.get(f"{server.url}/event-types/{NAME}/partitions").status_code == 200
        cursors = [{"partition": "0", "offset": BEGIN}]
        lines: list[bytes] = []
        if kind in ("500", "503", "429"):
            response = open_stream(server, cursors)
            assert_problem(response, int(kind), "injected")
            if kind == "429":
                assert response.headers["Retry-After"] == "3"
        elif kind == "reset":
            with pytest.raises(requests.ConnectionError):
                open_stream(server, cursors)
        elif kind == "truncated":
            with (
                pytest.raises(requests.exceptions.ChunkedEncodingError),
                open_stream(server, cursors, batch_limit=5) as response,
            ):
                for line in response.iter_lines():  # not list(...): keep the lines read before the error
                    lines.append(line)  # noqa: PERF402
            batches = [json.loads(line) for line in lines[:2]]
            assert offsets_and_events([(b, b"") for b in batches], "0") == expected[:10]
            assert lines[2:] == [] or not lines[2].endswith(b"}")  # at most half of the third line
        elif kind == "junk":
            with open_stream(server, cursors, batch_limit=5) as response:
                body = response.content  # the stream ends by itself
            lines = body.split(b"\n")
            assert lines[2] == b"Internal server error" and len(lines) == 3
            assert offsets_and_events([(json.loads(line), b"") for line in lines[:2]], "0") == expected[:10]
        else:
            batches = read_stream(server, cursors, batch_limit=3)
            assert offsets_and_events(batches, "0") == expected
        assert server.fault_counts == {kind: 1}


def test_stream_limit_timeout_and_keep_alive_limit_end_the_stream() -> None:
    event_type = NakadiEventType(partitions=2, events=100, seed=12)
    with NakadiDemoServer(event_type) as server:
        cursors = [{"partition": "0", "offset": BEGIN}, {"partition": "1", "offset": BEGIN}]
        with open_stream(server, cursors, batch_limit=3, stream_limit=10) as response:
            batches = [json.loads(line) for line in response.iter_lines()]  # ends without our help
        assert sum(len(b["events"]) for b in batches) == 10 and all("events" in b for b in batches)

        started = time.monotonic()
        timed = {"batch_limit": 1000, "stream_timeout": 0.3, "batch_flush_timeout": 0.1}
        with open_stream(server, cursors[:1], **timed) as response:
            batches = [json.loads(line) for line in response.iter_lines()]
        assert 0.25 < time.monotonic() - started < 3
        assert "events" in batches[0] and len(batches) >= 3 and all("events" not in b for b in batches[1:])

        with open_stream(server, cursors, batch_limit=1000, stream_keep_alive_limit=2) as response:
            batches = [json.loads(line) for line in response.iter_lines()]
        assert [("events" in b) for b in batches] == [True, True, False, False, False, False]


def test_gate_holds_a_partition() -> None:
    event_type = NakadiEventType(partitions=2, events=20, seed=13)
    with NakadiDemoServer(event_type) as server:
        server.gate = gate = Gate(partition=1)
        result: list[list[tuple[dict, bytes]]] = []
        reader = threading.Thread(
            target=lambda: result.append(read_stream(server, [{"partition": "1", "offset": BEGIN}], batch_limit=100))
        )
        reader.start()
        assert gate.arrived.wait(5)
        event_type.append(30)  # arrives while the stream is held
        gate.opened.set()
        reader.join(10)
    assert offsets_and_events(result[0], "1") == stored(event_type, 1)


def test_cli_registers_the_subcommand() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["nakadi-server", "--port", "0", "--partitions", "2"])
    settings = (args.port, args.partitions, args.duplicate_ratio, args.event_type, args.host)
    assert settings == (0, 2, 0.05, NAME, "127.0.0.1")
    assert args.func.__name__ == "run"
