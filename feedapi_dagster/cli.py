"""The `feedapi-dagster` console command.

Each subcommand lives next to the code it drives and contributes itself through a
`register(subparsers)` function that sets `func` on its parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# module path of each subcommand provider, in the order shown by --help
_COMMAND_MODULES: tuple[str, ...] = (
    "feedapi_dagster.orchestration.demo_commands",
    "feedapi_dagster.orchestration.doctor",
    "feedapi_dagster.orchestration.discover_command",
    "feedapi_dagster.orchestration.sql_command",
    "feedapi_dagster.orchestration.warm_up",
    "feedapi_dagster.orchestration.setup_command",
    "feedapi_dagster.spark.commands",
    "feedapi_dagster.lakehouse.state_command",
    "feedapi_dagster.demo.feedapi.command",
    "feedapi_dagster.demo.nakadi.command",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="feedapi-dagster", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_path in _COMMAND_MODULES:
        importlib.import_module(module_path).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
