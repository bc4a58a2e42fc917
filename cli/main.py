"""The `stageprof` command line: one thin module per subcommand under `cli/commands/`; the
gate's is `cli/gate/command.py`, beside its rules (cli/gate uses cli/commands, not back)."""

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

# Each module defines `register(subparsers)`; it sets `func(args) -> int` on its parser.
COMMAND_MODULES: tuple[str, ...] = (
    "cli.commands.db",
    "cli.commands.export",
    "cli.gate.command",
    "cli.commands.plan",
    "cli.commands.profile",
    "cli.commands.serve",
    "cli.commands.worker",
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


# Libraries whose start-up warnings (Ray's token notice, jax's backend probing, XLA's C++
# logs) say nothing a stageprof user can act on; `--verbose` shows them.
QUIET_LOGGERS: tuple[str, ...] = ("ray", "jax._src.xla_bridge", "absl")


def quiet_libraries() -> None:
    """Only errors from Ray, jax's backend set-up and XLA's C++ logging."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        quiet_libraries()
    from client.sdk import StageprofError

    try:
        return int(args.func(args) or 0)
    except StageprofError as err:
        print(f"stageprof {args.command}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
