"""What the console commands of the demo servers (`demo-server`, `nakadi-server`) share: the flags of
any demo server, and serving until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import signal
import threading

from feedapi_dagster.demo.faults import Faults
from feedapi_dagster.demo.http_server import DemoServer


def add_server_arguments(parser: argparse.ArgumentParser, port: int) -> None:
    """--host and --port (default `port`)."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=port, help="0 picks a free port")


def add_size_arguments(parser: argparse.ArgumentParser) -> None:
    """--partitions, --events and --token-env."""
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--events", type=int, default=10000)
    parser.add_argument("--token-env", metavar="NAME", help="require `Authorization: Bearer $NAME`")


def add_fault_arguments(parser: argparse.ArgumentParser, what_fails: str) -> None:
    """--fault-rate (the share of `what_fails` that fail) and --seed (of the feed and its faults)."""
    parser.add_argument("--fault-rate", type=float, default=0.0, help=f"share of {what_fails} that fail")
    parser.add_argument("--seed", type=int, default=0)


def faults_from(args: argparse.Namespace) -> Faults | None:
    """The faults of --fault-rate and --seed (None without faults)."""
    return Faults(args.fault_rate, seed=args.seed) if args.fault_rate else None


def serve_until_signalled(server: DemoServer) -> int:
    """Serve, print the server's URL (what a caller waits for), and stop on SIGINT or SIGTERM."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with server:
        print(server.url, flush=True)
        stop.wait()
    return 0
