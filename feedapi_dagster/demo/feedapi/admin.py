"""The FeedAPI demo server's admin actions on its feed (see `demo/admin.py` for the endpoint):
GET /admin/published?partition=, POST /admin/append, /admin/close, /admin/split, /admin/rotate-token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import SplitResult, parse_qs

from feedapi_dagster.demo.admin import AdminActions
from feedapi_dagster.demo.feedapi.demo_feed import DemoFeed


def feed_admin_actions(feed: DemoFeed, rotate_token: Callable[[], str]) -> AdminActions:
    """The actions on `feed`; `rotate_token`: the server's, which returns the new discovery token."""

    def published(args: dict[str, Any], url: SplitResult) -> object:
        return feed.published(int(parse_qs(url.query)["partition"][0]))

    def append(args: dict[str, Any], url: SplitResult) -> object:
        partition = args.get("partition")
        count = int(args.get("count", 1))
        return {"appended": len(feed.append(count, None if partition is None else int(partition)))}

    def close(args: dict[str, Any], url: SplitResult) -> object:
        feed.close(int(args["partition"]))
        return {"closed": int(args["partition"])}

    def split(args: dict[str, Any], url: SplitResult) -> object:
        split_method = {1: feed.split_method1, 2: feed.split_method2}.get(int(args.get("method") or 0))
        if split_method is None:
            raise ValueError("method must be 1 or 2")
        return {"children": split_method(int(args["partition"]), int(args.get("children", 2)))}

    return {
        ("GET", "/admin/published"): published,
        ("POST", "/admin/append"): append,
        ("POST", "/admin/close"): close,
        ("POST", "/admin/split"): split,
        ("POST", "/admin/rotate-token"): lambda args, url: {"token": rotate_token()},
    }
