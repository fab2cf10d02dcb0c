"""`feedapi-dagster nakadi-server`: serve a generated Nakadi event type until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
from typing import Any

from feedapi_dagster.demo.nakadi.event_type import NakadiEventType
from feedapi_dagster.demo.nakadi.server import NakadiDemoServer
from feedapi_dagster.demo.server_command import (
    add_fault_arguments,
    add_server_arguments,
    add_size_arguments,
    faults_from,
    serve_until_signalled,
)
from feedapi_dagster.demo.tokens import token_from

DEFAULT_PORT = 8766


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("nakadi-server", help="serve a generated Nakadi event type on HTTP")
    add_server_arguments(parser, DEFAULT_PORT)
    parser.add_argument("--event-type", default="demo.orders", help="the event type's name")
    add_size_arguments(parser)
    # Nakadi is at-least-once: a demo without duplicates would not show it
    parser.add_argument("--duplicate-ratio", type=float, default=0.05, help="share of events published twice")
    add_fault_arguments(parser, "event streams")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    event_type = NakadiEventType(
        args.event_type,
        partitions=args.partitions,
        events=args.events,
        seed=args.seed,
        duplicate_ratio=args.duplicate_ratio,
    )
    return serve_until_signalled(
        NakadiDemoServer(
            event_type, host=args.host, port=args.port, token=token_from(args.token_env), faults=faults_from(args)
        )
    )
