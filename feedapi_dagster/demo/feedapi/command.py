"""`feedapi-dagster demo-server`: serve a generated FeedAPI feed until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from feedapi_dagster.demo.feedapi.demo_feed import DemoFeed
from feedapi_dagster.demo.feedapi.server import DIALECTS, DemoFeedServer
from feedapi_dagster.demo.server_command import (
    add_fault_arguments,
    add_server_arguments,
    add_size_arguments,
    faults_from,
    serve_until_signalled,
)
from feedapi_dagster.demo.tokens import token_from

DEFAULT_PORT = 8765
# an at-least-once demo feed without duplicates would not show what at-least-once means
AT_LEAST_ONCE_DUPLICATE_RATIO = 0.05


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("demo-server", help="serve a generated FeedAPI feed on HTTP")
    add_server_arguments(parser, DEFAULT_PORT)
    parser.add_argument("--dialect", choices=DIALECTS, default="draft")
    add_size_arguments(parser)
    parser.add_argument("--at-least-once", action="store_true", help="publish some events twice")
    parser.add_argument(
        "--no-stream", dest="stream", action="store_false", help="the draft dialect does not offer `stream` fetches"
    )
    parser.add_argument(
        "--publish-rate",
        type=float,
        default=0.0,
        metavar="EVENTS_PER_S",
        help="keep publishing events at this rate while serving (an open `stream` fetch shows them arrive)",
    )
    add_fault_arguments(parser, "fetches")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    feed = DemoFeed(
        partitions=args.partitions,
        events=args.events,
        exactly_once=not args.at_least_once,
        seed=args.seed,
        duplicate_ratio=AT_LEAST_ONCE_DUPLICATE_RATIO if args.at_least_once else 0.0,
    )
    server = DemoFeedServer(
        feed,
        dialect=args.dialect,
        host=args.host,
        port=args.port,
        token=token_from(args.token_env),
        faults=faults_from(args),
        stream=args.stream,
    )
    if args.publish_rate > 0:
        threading.Thread(target=_publish, args=(feed, args.publish_rate), name="publish", daemon=True).start()
    return serve_until_signalled(server)


def _publish(feed: DemoFeed, per_second: float) -> None:
    """Append `per_second` events a second, a tenth of a second's worth at a time, while the process lives."""
    due = 0.0
    while True:
        time.sleep(0.1)
        due += per_second / 10
        if due >= 1:
            feed.append(int(due))
            due -= int(due)
