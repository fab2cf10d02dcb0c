"""Every kind of answer `FeedClient` reads, cut mid-body by a proxy (`tests/cutting_proxy.py`: the
status and headers announce the whole body, by Content-Length or as a chunk, half of it comes, the
connection closes): cut on the first tries it is read on a later one, as if nothing happened; cut
every time it is one `ProtocolError` of one line naming the feed (its URL without credentials) and
what was cut. And the errors of `requests` no retry mends, which reach the caller as `ProtocolError`s
too."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from feedapi_dagster.demo import DemoFeed, DemoFeedServer, NakadiDemoServer, NakadiEventType
from feedapi_dagster.protocol import FeedClient, FeedSettings, ProtocolError, RetryPolicy, feed_settings
from tests.cutting_proxy import Cut, CuttingProxy

from .conftest import CannedServer

ATTEMPTS = 4
RETRY = RetryPolicy(max_attempts=ATTEMPTS, base_delay=0.001, max_delay=0.01)
TOKEN = "tok-cut-answers-secret"
USERINFO = "alice:s3cret"  # in the FeedAPI feed's URL: never in an error
BEYOND = "001-0001-000000000000999999"  # a Nakadi offset past the newest: 422


@pytest.fixture(scope="module")
def servers():
    event_type = NakadiEventType(partitions=2, events=60, seed=3)
    with (
        DemoFeedServer(DemoFeed(partitions=2, events=60, seed=3), dialect="published") as feedapi,
        NakadiDemoServer(event_type, token=TOKEN) as nakadi,
    ):
        yield {"feedapi": feedapi, "nakadi": nakadi}


def settings(servers, protocol: str, url: str, **options) -> FeedSettings:
    """The feed of `protocol` at `url` (the server's, or a proxy's in front of it)."""
    if protocol == "feedapi":
        return feed_settings(url=url.replace("http://", f"http://{USERINFO}@"), retry=RETRY, **options)
    options.setdefault("event_type", servers["nakadi"].event_type.name)
    return feed_settings(url=url, protocol="nakadi", token=TOKEN, retry=RETRY, **options)


def read_all(client: FeedClient) -> Any:
    """Partition 0's events and its last cursor (a read resumed after a cut comes in other runs)."""
    events, cursor = [], None
    for run in client.page_runs(0):
        events += [msgspec.json.decode(raw) for raw in run.raw_events]
        cursor = run.cursor
    assert events  # a read of something
    return events, cursor


def refused(cursor: str) -> Callable[[FeedClient], Any]:
    """A read of partition 0 after `cursor`, which the server refuses."""
    return lambda client: list(client.page_runs(0, cursor))


@dataclass(frozen=True)
class Answer:
    """A kind of answer: of which protocol, which answers are it (`matches(path, status)`), how a
    client reads it (its outcome), the request that asked for it and its status."""

    protocol: str
    matches: Callable[[str, int], bool]
    read: Callable[[FeedClient], Any]
    what: str
    status: int
    options: tuple[tuple[str, str], ...] = ()


ANSWERS = {
    "feedapi-discovery": Answer("feedapi", lambda path, status: path == "/feed", FeedClient.discover, "discovery", 200),
    "nakadi-partitions": Answer(
        "nakadi", lambda path, status: path.endswith("/partitions"), FeedClient.discover, "discovery", 200
    ),
    "feedapi-page": Answer("feedapi", lambda path, status: path == "/feed/events", read_all, "fetch", 200),
    "nakadi-events": Answer("nakadi", lambda path, status: path.endswith("/events"), read_all, "fetch", 200),
    # a refusal's body says why: a cut one must not leave it unexplained
    "feedapi-refusal": Answer("feedapi", lambda path, status: status == 400, refused("bogus"), "fetch", 400),
    "nakadi-refusal": Answer("nakadi", lambda path, status: status == 422, refused(BEYOND), "fetch", 422),
    "nakadi-discovery-refusal": Answer(
        "nakadi", lambda path, status: status == 404, FeedClient.discover, "discovery", 404, (("event_type", "gone"),)
    ),
    # the event type, whose JSON Schema declares the columns, and its 404
    "nakadi-event-type": Answer(
        "nakadi", lambda path, status: path.endswith("/demo.orders"), FeedClient.declared_columns, "schema", 200
    ),
    "nakadi-event-type-refusal": Answer(
        "nakadi",
        lambda path, status: status == 404,
        FeedClient.declared_columns,
        "schema",
        404,
        (("event_type", "gone"),),
    ),
}


def outcome(servers, answer: Answer, url: str) -> Any:
    """What a client reads, or the error it raises (its status and message, the feed's URL left out)."""
    with FeedClient(settings(servers, answer.protocol, url, **dict(answer.options))) as client:
        try:
            if answer.what == "fetch":
                client.discover()
            return answer.read(client)
        except ProtocolError as error:
            return error.status, str(error).replace(client.safe_url, "<feed>")


@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("kind", sorted(ANSWERS))
def test_an_answer_cut_on_the_first_tries_is_read_on_the_next(servers, kind, framing):
    answer = ANSWERS[kind]
    server = servers[answer.protocol]
    expected = outcome(servers, answer, server.url)  # no proxy
    # every try but the last is cut: the client's every retry is needed
    with CuttingProxy(server.url, Cut(answer.matches, times=ATTEMPTS - 1, framing=framing)) as proxy:
        assert outcome(servers, answer, proxy.url) == expected
    assert proxy.cuts[0].done == ATTEMPTS - 1 and proxy.passed >= 1


@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("kind", sorted(ANSWERS))
def test_an_answer_cut_every_time_is_one_line_naming_the_feed_and_what_was_cut(servers, kind, framing):
    answer = ANSWERS[kind]
    with CuttingProxy(servers[answer.protocol].url, Cut(answer.matches, framing=framing)) as proxy:
        feed = settings(servers, answer.protocol, proxy.url, **dict(answer.options))
        with FeedClient(feed) as client, pytest.raises(ProtocolError) as caught:
            if answer.what == "fetch":
                client.discover()
            answer.read(client)
    message = str(caught.value)
    partition = " partition 0" if answer.what == "fetch" else ""
    assert message.startswith(
        f"feed {feed.safe_url}{partition}: giving up after {ATTEMPTS} attempts: "
        f"{answer.what}: the answer (HTTP {answer.status}) was cut short: "
    ), message
    assert "\n" not in message and TOKEN not in message and "s3cret" not in message
    # each attempt read a cut answer (a read goes on counting from the last checkpoint a cut page had)
    assert proxy.cuts[0].done == ATTEMPTS if answer.read is not read_all else proxy.cuts[0].done >= ATTEMPTS


def test_a_redirect_loop_is_a_protocol_error_at_once():
    """A gateway sending every request to its login page and back: `requests` gives up after 30
    redirects; no retry mends it."""
    server = CannedServer(lambda path, query, headers: (302, {"Location": path}, b""))
    try:
        with FeedClient(feed_settings(url=server.url, retry=RETRY)) as client, pytest.raises(ProtocolError) as caught:
            client.discover()
    finally:
        server.close()
    assert str(caught.value) == f"feed {server.url}: discovery: TooManyRedirects: Exceeded 30 redirects."
    assert len(server.requests) == 31  # one try: the first request and 30 redirects


@pytest.mark.parametrize("token", [f"{TOKEN}\n", f"{TOKEN} ", f"{TOKEN}\u2603"])
def test_a_token_no_header_can_carry_is_refused_without_quoting_it(monkeypatch, token):
    """A secret read from a file keeps its newline; `requests` refused it quoting the header, token and
    all, and a character outside Latin-1 failed in `http.client` (a `UnicodeEncodeError`)."""
    monkeypatch.setenv("CUT_ANSWERS_TOKEN", token)
    for feed in (
        feed_settings(url="http://127.0.0.1:9/feed", token=token),
        feed_settings(url="http://127.0.0.1:9/feed", token_env="CUT_ANSWERS_TOKEN"),
    ):
        with pytest.raises(ProtocolError, match="an HTTP header cannot carry it") as caught:
            FeedClient(feed)
        assert TOKEN not in str(caught.value) and "\n" not in str(caught.value)
