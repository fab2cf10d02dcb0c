"""`feedapi-dagster demo-server`: serve a generated FeedAPI feed until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
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
    return serve_until_signalled(
        DemoFeedServer(
            feed,
            dialect=args.dialect,
            host=args.host,
            port=args.port,
            token=token_from(args.token_env),
            faults=faults_from(args),
        )
    )
