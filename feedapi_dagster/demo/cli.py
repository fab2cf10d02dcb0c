"""`feedapi-dagster demo-server`: serve a generated feed until SIGINT/SIGTERM."""
from __future__ import annotations

import argparse
from typing import Any

from feedapi_dagster.demo.faults import Faults
from feedapi_dagster.demo.feed import DemoFeed
from feedapi_dagster.demo.http import serve_until_signalled, token_from
from feedapi_dagster.demo.server import DIALECTS, DemoFeedServer

# an at-least-once demo feed without duplicates would not show what at-least-once means
AT_LEAST_ONCE_DUPLICATE_RATIO = 0.05


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("demo-server", help="serve a generated FeedAPI feed on HTTP")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument("--dialect", choices=DIALECTS, default="draft")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--events", type=int, default=10000)
    parser.add_argument("--token-env", metavar="NAME", help="require `Authorization: Bearer $NAME`")
    parser.add_argument("--at-least-once", action="store_true", help="publish some events twice")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="share of fetches that fail")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    feed = DemoFeed(
        partitions=args.partitions,
        events=args.events,
        exactly_once=not args.at_least_once,
        seed=args.seed,
        duplicate_ratio=AT_LEAST_ONCE_DUPLICATE_RATIO if args.at_least_once else 0.0,
    )
    faults = Faults(args.fault_rate, seed=args.seed) if args.fault_rate else None
    return serve_until_signalled(DemoFeedServer(feed, dialect=args.dialect, host=args.host, port=args.port,
                                                token=token_from(args.token_env), faults=faults))
