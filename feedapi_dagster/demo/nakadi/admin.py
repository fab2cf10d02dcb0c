"""The demo Nakadi server's admin actions on its event type (see `demo/admin.py` for the endpoint):
POST /admin/append, /admin/repartition, /admin/expire, and GET /admin/stats."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import SplitResult

from feedapi_dagster.demo.admin import AdminActions
from feedapi_dagster.demo.nakadi.event_type import NakadiEventType


def event_type_admin_actions(event_type: NakadiEventType, fault_counts: Callable[[], dict[str, int]]) -> AdminActions:
    """The actions on `event_type`; `fault_counts`: the faults the server has played, by kind."""

    def append(args: dict[str, Any], url: SplitResult) -> object:
        count = int(args.get("count", 1))
        event_type.append(count)
        return {"appended": count, "published": event_type.published_count()}

    def expire(args: dict[str, Any], url: SplitResult) -> object:
        partition = int(args["partition"])
        event_type.expire(partition, int(args["keep_last"]))
        return event_type.partition(partition)

    def stats(args: dict[str, Any], url: SplitResult) -> object:
        return {
            "published": event_type.published_count(),
            "unique": event_type.unique_count(),
            "partitions": event_type.partition_count(),
            "fault_counts": fault_counts(),
        }

    return {
        ("POST", "/admin/append"): append,
        ("POST", "/admin/repartition"): lambda args, url: {
            "new_partitions": event_type.repartition(int(args["partitions"]))
        },
        ("POST", "/admin/expire"): expire,
        ("GET", "/admin/stats"): stats,
    }
