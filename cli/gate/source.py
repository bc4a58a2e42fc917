"""Where today's model comes from (`--zoo`, `--model FILE`, `--entry module:function`), what a
run of today's job gives the verdict, and the error that leaves the gate undecided."""

import argparse
import importlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.gate.verdict import Remeasured
from schemas import ModelSpec, Plan


class GateError(Exception):
    """The gate cannot decide (server down, job lost, bad input): exit 2, one line."""


@dataclass(frozen=True)
class TodayRun:
    """Today's job: its plan (None when it failed: `error` says why), its counts, and its
    measurements of the baseline's stages."""

    job_id: str
    plan: Plan | None
    error: str | None
    stats: dict[str, Any]
    remeasured: list[Remeasured] = field(default_factory=list)


def model_source(args: argparse.Namespace) -> str:
    """Which one of --zoo, --model, --entry was given (GateError unless exactly one)."""
    given = [n for n in ("zoo", "model", "entry") if getattr(args, n, None)]
    if len(given) != 1:
        named = ", ".join(f"--{n}" for n in given) or "none"
        raise GateError(f"give exactly one of --zoo, --model, --entry (got {named})")
    return given[0]


def describe_model(args: argparse.Namespace) -> str:
    """The model as given on the command line, for reports: "zoo mlp (hidden_size=64)"."""
    if args.entry:
        return f"entry {args.entry}"
    if args.model is not None:
        return f"model {args.model}"
    sets = f" ({', '.join(args.overrides)})" if args.overrides else ""
    return f"zoo {args.zoo}{sets}"


def load_spec_file(path: Path) -> ModelSpec:
    """A ModelSpec JSON file; GateError naming the file and the first problem."""
    from pydantic import ValidationError

    from cli.commands.zoo_args import one_line

    try:
        return ModelSpec.model_validate_json(path.read_text())
    except OSError as err:
        raise GateError(f"cannot read --model {path}: {err.strerror or err}") from err
    except ValidationError as err:
        raise GateError(f"--model {path} is not a model spec: {one_line(err)}") from err


def load_entry(ref: str) -> ModelSpec:
    """Call `module:function` (no arguments) and return the ModelSpec it traces; the module
    is imported from the current directory or the installed packages."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise GateError(f"--entry expects module:function, got {ref!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except Exception as err:  # the user's module: any import-time error is theirs to see
        raise GateError(f"--entry {ref}: {type(err).__name__}: {_first_line(err)}") from err
    if not callable(target):
        raise GateError(f"--entry {ref} is not a function")
    try:
        spec = target()
    except Exception as err:
        raise GateError(f"--entry {ref} raised {type(err).__name__}: {_first_line(err)}") from err
    if not isinstance(spec, ModelSpec):
        raise GateError(
            f"--entry {ref} returned {type(spec).__name__}, not a ModelSpec "
            "(client.trace(loss_fn, params, batch) makes one)"
        )
    return spec


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "(no message)"
