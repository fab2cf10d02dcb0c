"""A bundled Nakadi event bus for the demo and the tests: one `NakadiEventType` served over HTTP as
Nakadi serves it, through the low-level stream API (`handler.py`). The spec is
`spec/nakadi-event-bus-api.yaml`."""

from __future__ import annotations

from feedapi_dagster.demo.admin import AdminActions
from feedapi_dagster.demo.faults import Faults
from feedapi_dagster.demo.http_server import DemoServer
from feedapi_dagster.demo.nakadi.admin import event_type_admin_actions
from feedapi_dagster.demo.nakadi.event_type import NakadiEventType
from feedapi_dagster.demo.nakadi.handler import NakadiHandler


class NakadiDemoServer(DemoServer):
    """Serves `event_type` on http://host:port (the Nakadi base URL) until stopped; use as a context manager."""

    def __init__(
        self,
        event_type: NakadiEventType,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        faults: Faults | None = None,
        keep_alive_wait: float = 0.05,
    ) -> None:
        self.event_type = event_type
        # a demo shortcut: a caught-up partition gets its keep-alive after min(batch_flush_timeout, this)
        self.keep_alive_wait = keep_alive_wait
        super().__init__(host, port, NakadiHandler, token, faults)

    def admin_actions(self) -> AdminActions:
        return {**event_type_admin_actions(self.event_type, self.counted_faults), **super().admin_actions()}
