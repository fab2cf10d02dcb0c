"""The demo server over real HTTP on 127.0.0.1: wire shapes per dialect, paging, splits, errors, faults."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
import requests

from feedapi_dagster.demo import DemoFeed, DemoFeedServer, Faults
from feedapi_dagster.demo.faults import KINDS

FETCH_PATH = {"v1": "", "draft": "", "published": "/events"}
PAGE_SIZE_PARAM = {"v1": "pagesizehint", "draft": "pageSizeHint", "published": "pagesizehint"}


def payload(line: bytes) -> str:
    """The raw payload text of an event line as the server frames it (a JSON string comes decoded)."""
    key = b'"event":' if line.startswith(b'{"event":') else b'"data":'
    text = line[line.index(key) + len(key) : -1].decode()
    return json.loads(text) if text.startswith('"') else text


def fetch(
    server: DemoFeedServer, partition: int, cursor: str, page_size: int | None = None, **extra: str
) -> requests.Response:
    """One fetch request in the server's dialect."""
    params: dict[str, object] = dict(extra)
    if server.dialect == "v1":
        params.update({"n": server.feed.partition_count(), f"cursor{partition}": cursor})
    else:
        params.update({"partition": partition, "cursor": cursor})
    if server.dialect == "published":
        params.setdefault("token", requests.get(server.url).json()["token"])
    if page_size is not None:
        params[PAGE_SIZE_PARAM[server.dialect]] = page_size
    return requests.get(server.url + FETCH_PATH[server.dialect], params=params)


def parse_page(body: bytes) -> tuple[list[str], list[tuple[int, str]]]:
    """(events, checkpoints) of a page; a checkpoint is (number of events before it, cursor)."""
    events: list[str] = []
    checkpoints: list[tuple[int, str]] = []
    for line in body.split(b"\n"):
        line = line.rstrip(b"\r")
        if not line:
            continue
        message = json.loads(line)
        if "cursor" in message:
            checkpoints.append((len(events), message["cursor"]))
        elif "event" in message or "data" in message:
            events.append(payload(line))
    return events, checkpoints


def read_all(
    server: DemoFeedServer, partition: int, cursor: str = "_first", page_size: int = 37, **extra: str
) -> tuple[list[str], str]:
    """Page to the end; events after the last checkpoint of a page are not committed (none should exist)."""
    events: list[str] = []
    while True:
        response = fetch(server, partition, cursor, page_size, **extra)
        assert response.status_code == 200, response.text
        page_events, checkpoints = parse_page(response.content)
        if not checkpoints:  # an empty body: caught up
            assert not page_events
            return events, cursor
        assert page_events[checkpoints[-1][0] :] == [], "the last event of a page is followed by a checkpoint"
        events += page_events
        if checkpoints[-1][1] == cursor and not page_events:
            return events, cursor
        cursor = checkpoints[-1][1]


@pytest.mark.parametrize("dialect", ["v1", "draft", "published"])
def test_paging_from_first_returns_what_was_published(dialect: str) -> None:
    feed = DemoFeed(partitions=3, events=600, exactly_once=False, seed=1, duplicate_ratio=0.2)
    with DemoFeedServer(feed, dialect=dialect) as server:
        for partition in range(3):
            events, _ = read_all(server, partition)
            assert events == feed.published(partition)
    published = [e for p in range(3) for e in feed.published(p)]
    expected = [e for p in range(3) for e in feed.expected_events(p)]
    assert len(published) > len(expected) == 600  # duplicates exist and deduplicate to the generated events


def test_payloads_exercise_unicode_escapes_and_numbers() -> None:
    feed = DemoFeed(partitions=1, events=40, seed=2, string_ratio=0.3)
    texts = feed.published(0)
    objects = [t for t in texts if t.startswith("{")]
    assert any("Grüße" in t and "日本" in t and "🎉" in t and r"\"hi\"" in t and r"\u0000" in t for t in objects)
    assert any('"fee":1.0' in t for t in objects) and any('"qty":1e3' in t for t in objects)
    assert any(":0.10," in t for t in objects)
    assert {json.loads(t)["type"] for t in objects} == {"order.created", "order.paid", "order.shipped"}
    strings = [t for t in texts if not t.startswith("{")]
    assert strings and all("id" not in t for t in strings)


def test_draft_page_checkpoints_vary_and_close_the_page() -> None:
    feed = DemoFeed(partitions=1, events=300, seed=3)
    with DemoFeedServer(feed, dialect="draft") as server:
        body = fetch(server, 0, "_first", 300).content
    lines = [json.loads(line) for line in body.splitlines()]
    assert set().union(*lines) == {"event", "cursor"}
    gaps, run = [], 0
    for line in lines:
        if "cursor" in line:
            gaps.append(run)
            run = 0
        else:
            run += 1
    assert "cursor" in lines[-1] and set(gaps) == {1, 2, 3, 4, 5}


@pytest.mark.parametrize("empty", [False, True])
def test_caught_up(empty: bool) -> None:
    feed = DemoFeed(partitions=1, events=10, seed=4)
    with DemoFeedServer(feed, dialect="draft", empty_when_caught_up=empty) as server:
        _, cursor = read_all(server, 0)
        body = fetch(server, 0, cursor).content
        assert body == (b"" if empty else b'{"cursor":"%s"}\n' % cursor.encode())
        assert fetch(server, 0, "_last").content == (b"" if empty else body)
        feed.append(3, partition=0)
        assert read_all(server, 0, cursor)[0] == feed.published(0)[-3:]


def test_quirks_keep_the_events() -> None:
    feed = DemoFeed(partitions=1, events=200, seed=5)
    with DemoFeedServer(feed, dialect="published", quirks=True) as server:
        body = fetch(server, 0, "_first", 50).content
        assert b"\r\n" in body and b"\n\n" in body and b'{"resync":true}' in body
        assert read_all(server, 0)[0] == feed.published(0)


def test_discovery_shapes() -> None:
    feed = DemoFeed(partitions=4, events=200, seed=6)
    feed.close(1)
    children1 = feed.split_method1(0, children=2)
    children2 = feed.split_method2(3, children=2)
    grandchildren = feed.split_method2(children2[0], children=2)
    with DemoFeedServer(feed, dialect="draft") as server:
        draft = requests.get(server.url).json()
    with DemoFeedServer(feed, dialect="published") as server:
        published = requests.get(server.url).json()
    by_id = {p["id"]: p for p in draft["partitions"]}
    assert set(by_id) == {"0", "1", "2", str(children2[1]), *map(str, children1 + grandchildren)}
    assert by_id["0"] == {"id": "0", "closed": True, "lastCursor": by_id["0"]["lastCursor"]}
    assert by_id["1"]["closed"] and by_id["2"] == {"id": "2"}
    assert [by_id[str(c)] for c in children1] == [{"id": str(c), "startsAfterPartition": "0"} for c in children1]
    assert by_id[str(children2[1])] == {"id": str(children2[1]), "cursorFromPartitions": ["3"]}
    assert by_id[str(grandchildren[0])]["cursorFromPartitions"] == [str(children2[0]), "3"]
    assert draft["exactlyOnce"] is True and draft["filters"] == ["type"]
    assert published["token"] and "filters" not in published
    assert [p for p in published["partitions"] if p.get("closed")] == [
        {"id": "0", "closed": True},
        {"id": "1", "closed": True},
    ]
    with pytest.raises(ValueError):
        feed.split_method1(1)  # closed
    with pytest.raises(ValueError):
        feed.close(3)  # vanished


def test_method1_children_get_the_new_events() -> None:
    feed = DemoFeed(partitions=1, events=50, seed=7)
    with DemoFeedServer(feed, dialect="draft") as server:
        children = feed.split_method1(0, children=2)
        feed.append(60)
        assert read_all(server, 0)[0] == feed.published(0) and len(feed.published(0)) == 50
        assert sorted(read_all(server, children[0])[0] + read_all(server, children[1])[0]) == sorted(
            feed.published(children[0]) + feed.published(children[1])
        )
        assert len(feed.published(children[0])) + len(feed.published(children[1])) == 60


def test_method2_child_from_parent_cursor_returns_the_rest() -> None:
    feed = DemoFeed(partitions=1, events=200, seed=8)
    with DemoFeedServer(feed, dialect="draft") as server:
        before, checkpoints = parse_page(fetch(server, 0, "_first", 80).content)
        cursor = checkpoints[-1][1]
        history = feed.published(0)
        assert before == history[:80]
        children = feed.split_method2(0, children=2)
        assert fetch(server, 0, "_first").status_code == 404  # the parent vanished
        feed.append(30)
        logs = [feed.published(child) for child in children]
        assert set(history) <= set(logs[0] + logs[1]) and len(logs[0]) + len(logs[1]) == 230
        rest = [read_all(server, child, cursor)[0] for child in children]
        for log, tail in zip(logs, rest, strict=True):
            assert tail == log[len(log) - len(tail) :]  # a cursor of the parent is a position in the child
        assert sorted(before + rest[0] + rest[1]) == sorted(logs[0] + logs[1])
        assert [read_all(server, child)[0] for child in children] == logs
    aggregates = [{json.loads(t)["aggregate"] for t in log if t.startswith("{")} for log in logs]
    assert aggregates[0] and aggregates[1] and not aggregates[0] & aggregates[1]


def test_published_token_changes_with_rotation_and_splits() -> None:
    feed = DemoFeed(partitions=2, events=20, seed=9)
    with DemoFeedServer(feed, dialect="published") as server:
        token = requests.get(server.url).json()["token"]
        assert fetch(server, 0, "_first", token=token).status_code == 200
        server.rotate_token()
        response = fetch(server, 0, "_first", token=token)
        assert response.status_code == 409
        token = requests.get(server.url).json()["token"]
        feed.split_method2(1)
        assert fetch(server, 0, "_first", token=token).status_code == 409
        assert fetch(server, 0, "_first").status_code == 200  # fresh discovery token


@pytest.mark.parametrize("dialect", ["v1", "draft", "published"])
def test_bearer_token_required(dialect: str) -> None:
    feed = DemoFeed(partitions=1, events=5, seed=10)
    with DemoFeedServer(feed, dialect=dialect, token="s3cret") as server:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            response = requests.get(server.url, headers=headers)
            assert (response.status_code, response.text.strip()) == (401, "unauthorized")
            assert "s3cret" not in response.text
        fetch_url = server.url + FETCH_PATH[dialect]
        assert requests.get(fetch_url, params={"partition": 0, "cursor": "_first"}).status_code == 401
        ok = requests.get(server.url, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == (400 if dialect == "v1" else 200)
        assert requests.get(server.url.replace("/feed", "/admin/published"), params={"partition": 0}).status_code == 200


def test_bad_requests() -> None:
    feed = DemoFeed(partitions=2, events=20, seed=11)
    with DemoFeedServer(feed, dialect="draft") as server:
        response = fetch(server, 0, "not-a-cursor")
        assert response.status_code == 400 and "cursor" in response.text
        assert fetch(server, 7, "_first").status_code == 404
        assert fetch(server, 0, "_first", **{"filter-subject": "x"}).status_code == 400
        assert fetch(server, 0, "_first", 0).status_code == 400
        assert requests.get(server.url, params={"partition": "x", "cursor": "_first"}).status_code == 400
        assert requests.get(server.url + "/events").status_code == 404
    with DemoFeedServer(feed, dialect="published") as server:
        assert fetch(server, 0, "_first", **{"event-types": "a", "skip-event-types": "b"}).status_code == 400
        assert fetch(server, 0, "_first", token="old").status_code == 409
    with DemoFeedServer(feed, dialect="v1") as server:
        response = requests.get(server.url)
        assert (response.status_code, response.text.strip()) == (400, "no cursors")
        assert requests.get(server.url, params={"n": 3, "cursor0": "_first"}).status_code == 400
        assert requests.get(server.url, params={"n": 2, "cursor0": "_first", "cursor1": "_first"}).status_code == 400
        assert requests.get(server.url, params={"n": 2, "cursor5": "_first"}).status_code == 404
        with pytest.raises(ValueError):
            feed.split_method1(0)


def test_v1_lines_carry_the_partition() -> None:
    feed = DemoFeed(partitions=2, events=40, seed=12)
    with DemoFeedServer(feed, dialect="v1") as server:
        lines = [json.loads(line) for line in fetch(server, 1, "_first", 50).content.splitlines()]
    assert all(line["partition"] == 1 for line in lines)
    assert any("headers" in line for line in lines)


def test_draft_filter() -> None:
    feed = DemoFeed(partitions=1, events=300, seed=13)
    with DemoFeedServer(feed, dialect="draft") as server:
        paid, cursor = read_all(server, 0, page_size=10, **{"filter-type": "order.paid"})
        assert paid == [t for t in feed.published(0) if t.startswith("{") and json.loads(t)["type"] == "order.paid"]
        assert cursor == read_all(server, 0)[1]  # filtered-out events advance the cursor to the end
        only_cursor = fetch(server, 0, "_first", 5, **{"filter-type": "none"}).content
        assert only_cursor.count(b"\n") == 1 and b'"cursor"' in only_cursor


def test_published_filters() -> None:
    feed = DemoFeed(partitions=1, events=300, seed=14)
    types = lambda texts: {json.loads(t)["type"] if t.startswith("{") else None for t in texts}  # noqa: E731
    with DemoFeedServer(feed, dialect="published") as server:
        assert types(read_all(server, 0, **{"event-types": "order.paid;order.shipped"})[0]) == {
            "order.paid",
            "order.shipped",
        }
        assert types(read_all(server, 0, **{"skip-event-types": "order.paid"})[0]) == {
            "order.created",
            "order.shipped",
            None,
        }
    with DemoFeedServer(feed, dialect="published", ignore_filters=True) as server:
        assert read_all(server, 0, **{"event-types": "order.paid"})[0] == feed.published(0)


def test_add_event_keeps_exact_text() -> None:
    feed = DemoFeed(partitions=1, events=0, seed=15)
    big = json.dumps({"id": "big", "blob": "x" * 3_000_000})
    odd = ['[1,2,{"a":1.0}]', "42", '"\\u00e9t\\u00e9"', '{"id":"e-1","k":1E3}']
    for text in [big, *odd]:
        feed.add_event(text, partition=0)
    with pytest.raises(ValueError):
        feed.add_event('{"a":\n1}', partition=0)
    with pytest.raises(ValueError):
        feed.add_event("{not json", partition=0)
    assert feed.published(0) == [big, *odd[:2], "été", odd[3]]
    with DemoFeedServer(feed, dialect="draft") as server:
        assert read_all(server, 0, page_size=2)[0] == feed.published(0)


@pytest.mark.parametrize("kind", KINDS)
def test_each_fault_kind(kind: str) -> None:
    feed = DemoFeed(partitions=1, events=30, seed=16)
    with DemoFeedServer(feed, dialect="draft") as server:
        good = fetch(server, 0, "_first", 10).content
        server.faults = Faults(rate=1.0, seed=1, retry_after=0, kinds=(kind,))
        assert requests.get(server.url).status_code == 200  # discovery never faults
        parts = urlsplit(server.url)
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
        connection.request("GET", "/feed?partition=0&cursor=_first&pageSizeHint=10")
        if kind == "reset":
            with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
                connection.getresponse()
        else:
            response = connection.getresponse()
            if kind == "truncated":
                assert response.status == 200
                with pytest.raises(http.client.IncompleteRead):
                    response.read()
            else:
                body = response.read()
                assert response.status == {"500": 500, "503": 503, "429": 429}.get(kind, 200)
                if kind == "429":
                    assert response.getheader("Retry-After") == "0"
                if kind == "junk":
                    complete, junk = body.rsplit(b"\n", 1)
                    assert junk == b"Internal server error" and good.startswith(complete)
                if kind == "slow":
                    assert body == good
        connection.close()
        assert server.fault_counts == {kind: 1}


def test_faults_rate_is_a_share_of_fetches() -> None:
    feed = DemoFeed(partitions=1, events=5, seed=17)
    with DemoFeedServer(feed, dialect="draft", faults=Faults(rate=0.5, seed=3, kinds=("500", "503"))) as server:
        statuses = [fetch(server, 0, "_first").status_code for _ in range(60)]
    assert 10 < statuses.count(200) < 50 and sum(server.fault_counts.values()) == 60 - statuses.count(200)


def test_admin_endpoint() -> None:
    feed = DemoFeed(partitions=2, events=10, seed=18)
    with DemoFeedServer(feed, dialect="published") as server:
        admin = server.url.replace("/feed", "/admin")
        assert requests.post(f"{admin}/append", json={"count": 5, "partition": 1}).json() == {"appended": 5}
        assert len(feed.published(1)) == len(requests.get(f"{admin}/published", params={"partition": 1}).json())
        assert requests.get(f"{admin}/published", params={"partition": 1}).json() == feed.published(1)
        assert requests.post(f"{admin}/close", json={"partition": 1}).json() == {"closed": 1}
        children = requests.post(f"{admin}/split", json={"partition": 0, "method": 2, "children": 2}).json()["children"]
        assert [p["id"] for p in requests.get(server.url).json()["partitions"]] == ["1", *map(str, children)]
        token = requests.get(server.url).json()["token"]
        assert requests.post(f"{admin}/rotate-token", json={}).json()["token"] != token
        assert requests.post(f"{admin}/faults", json={"rate": 1.0, "seed": 1, "retry_after": 0, "kinds": ["503"]}).ok
        assert fetch(server, children[0], "_first").status_code == 503
        for path, body in [
            ("close", {"partition": 99}),
            ("split", {"partition": 1, "method": 1}),
            ("append", {"count": "x"}),
            ("split", {"partition": children[0], "method": 3}),
            ("close", {}),
        ]:
            response = requests.post(f"{admin}/{path}", json=body)
            assert response.status_code == 400 and response.json()["error"], (path, body)


def test_stop_closes_keep_alive_connections() -> None:
    feed = DemoFeed(partitions=1, events=5, seed=19)
    session = requests.Session()
    with DemoFeedServer(feed, dialect="draft") as server:
        assert session.get(server.url).ok
    with pytest.raises(requests.ConnectionError):
        session.get(server.url)


def test_console_demo_server() -> None:
    env = {**os.environ, "DEMO_TOKEN": "t0k"}
    command = [
        sys.executable,
        "-m",
        "feedapi_dagster.cli",
        "demo-server",
        "--port",
        "0",
        "--events",
        "50",
        "--dialect",
        "published",
        "--token-env",
        "DEMO_TOKEN",
        "--at-least-once",
    ]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as process:
        try:
            url = process.stdout.readline().strip()  # type: ignore[union-attr]
            discovery = requests.get(url, headers={"Authorization": "Bearer t0k"}, timeout=5).json()
            assert discovery["exactlyOnce"] is False and len(discovery["partitions"]) == 4
        finally:
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
