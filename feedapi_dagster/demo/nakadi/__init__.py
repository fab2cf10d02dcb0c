"""The bundled Nakadi demo server: its event type (`event_type.py`, with `offsets.py`), the stream it
serves (`stream_request.py`, `stream.py`), its errors (`problems.py`), the server, its HTTP handler,
admin actions and command."""

from feedapi_dagster.demo.nakadi.event_type import NakadiEventType
from feedapi_dagster.demo.nakadi.offsets import BEGIN, format_offset, parse_offset
from feedapi_dagster.demo.nakadi.server import NakadiDemoServer

__all__ = ["BEGIN", "NakadiDemoServer", "NakadiEventType", "format_offset", "parse_offset"]
