"""Arguments shared by commands that take a model: `--zoo NAME --set k=v` or `--model FILE`."""

import argparse
import json
from pathlib import Path
from typing import Any

from schemas import ModelSpec


def add_model_arguments(parser: argparse.ArgumentParser, *, default_zoo: str | None) -> None:
    group = parser.add_mutually_exclusive_group(required=default_zoo is None)
    group.add_argument("--zoo", default=default_zoo, help="zoo model name (e.g. gpt, mlp)")
    group.add_argument("--model", type=Path, help="a ModelSpec JSON file (see client.trace)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="K=V",
        help="zoo override, repeatable (values parsed as JSON when they can be)",
    )


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`["num_layers=4", "preset=gpt-350m"]` → `{"num_layers": 4, "preset": "gpt-350m"}`."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects K=V, got {item!r}")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def load_model(args: argparse.Namespace) -> ModelSpec:
    """The model the arguments name: a spec file, or a zoo model built with its overrides."""
    if args.model is not None:
        import programs

        return programs.verified(ModelSpec.model_validate_json(args.model.read_text()))
    from client import zoo

    return zoo.build(args.zoo, **parse_overrides(args.overrides))


def one_line(err: Exception) -> str:
    """A one-line message for bad arguments: `field.path: reason` for validation errors."""
    from pydantic import ValidationError

    if isinstance(err, ValidationError):
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        return f"{loc}: {first['msg']}" if loc else str(first["msg"])
    return str(err).splitlines()[0] if str(err) else type(err).__name__
