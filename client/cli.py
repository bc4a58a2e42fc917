"""The `stageprof` command line: one thin module per subcommand under `client/commands/`."""

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

# Each module defines `register(subparsers)`; it sets `func(args) -> int` on its parser.
COMMAND_MODULES: tuple[str, ...] = (
    "client.commands.db",
    "client.commands.gate",
    "client.commands.plan",
    "client.commands.profile",
    "client.commands.serve",
    "client.commands.worker",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stageprof", description="Pipeline-stage profiling and planning for JAX training."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
