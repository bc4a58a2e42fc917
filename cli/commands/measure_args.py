"""The command-line options of how a candidate is measured (shared by `plan` and `profile`)."""

import argparse
from typing import Any


def add_measurement_arguments(parser: argparse.ArgumentParser) -> None:
    """--optimizer, --repeats, --max-repeats, --target-spread, --warmup."""
    parser.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    parser.add_argument(
        "--repeats", type=int, default=5, help="least timed runs per module (then adaptive)"
    )
    parser.add_argument("--max-repeats", type=int, default=40, help="most timed runs per module")
    parser.add_argument(
        "--target-spread",
        type=float,
        default=0.05,
        help="add timed runs until (p90 - p10) / median is under this (or --max-repeats)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per module")


def measurement_options(args: argparse.Namespace) -> dict[str, Any]:
    """The `PlanOptions` fields those options set."""
    return {
        "optimizer": args.optimizer,
        "repeats": args.repeats,
        "max_repeats": max(args.repeats, args.max_repeats),
        "target_spread": args.target_spread,
        "warmup": args.warmup,
    }
