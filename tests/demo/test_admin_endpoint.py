"""What both demo servers' admin endpoints share (`demo/admin.py`): the faults, set the same way on
each, and the answers to a request that is not an action or whose body is not a JSON object."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from feedapi_dagster.demo import (
    DemoFeed,
    DemoFeedServer,
    NakadiDemoServer,
    NakadiEventType,
)
from feedapi_dagster.demo.http_server import DemoServer


@pytest.fixture(params=["feedapi", "nakadi"])
def server(request: pytest.FixtureRequest) -> Iterator[DemoServer]:
    if request.param == "feedapi":
        served: DemoServer = DemoFeedServer(DemoFeed(partitions=2, events=10, seed=41), dialect="draft")
    else:
        served = NakadiDemoServer(NakadiEventType(partitions=2, events=10, seed=41))
    with served:
        yield served


def admin_url(server: DemoServer) -> str:
    return server.url.removesuffix("/feed") + "/admin"


def test_faults_are_set_the_same_way_on_both_servers(server: DemoServer) -> None:
    settings = {"rate": 0.5, "seed": 7, "retry_after": 2, "kinds": ["503", "reset"]}
    response = requests.post(f"{admin_url(server)}/faults", json=settings)
    assert (response.status_code, response.json()) == (200, settings)
    assert server.faults is not None and (server.faults.rate, server.faults.kinds) == (0.5, ("503", "reset"))
    defaults = requests.post(f"{admin_url(server)}/faults", data=b"").json()
    assert defaults["rate"] == 0.0 and defaults["retry_after"] == 1 and len(defaults["kinds"]) == 7


@pytest.mark.parametrize("body", [{"rate": 2.0}, {"kinds": ["gone"]}, {"rate": "x"}])
def test_bad_fault_settings_are_a_400(server: DemoServer, body: dict[str, object]) -> None:
    response = requests.post(f"{admin_url(server)}/faults", json=body)
    assert response.status_code == 400 and response.json()["error"]
    assert server.faults is None


def test_unknown_actions_and_bodies_that_are_not_objects(server: DemoServer) -> None:
    response = requests.post(f"{admin_url(server)}/nothing", json={})
    assert (response.status_code, response.json()) == (404, {"error": "no admin action POST /admin/nothing"})
    response = requests.post(f"{admin_url(server)}/faults", json=[1])
    assert (response.status_code, response.json()) == (400, {"error": "the request body must be a JSON object"})
    assert requests.post(f"{admin_url(server)}/faults", data=b"{").status_code == 400
