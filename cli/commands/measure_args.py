"""The command-line options of how a candidate is measured (shared by `plan` and `profile`),
and `field_argument`: a flag whose default, help and choices are a schema field's."""

import argparse
import typing
from typing import Any

from pydantic import BaseModel

from schemas import ClusterSpec, PlanOptions

GIB = 2**30


def field_default(model: type[BaseModel], name: str) -> Any:
    """The default of `model`'s field `name` (its default factory called)."""
    return model.model_fields[name].get_default(call_default_factory=True)


def field_argument(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    flag: str,
    model: type[BaseModel],
    name: str,
    **kwargs: Any,
) -> None:
    """Add `flag` for `model`'s field `name`: its default, its description as the help and,
    for a Literal field, its values as the choices; `kwargs` add to or override them."""
    info = model.model_fields[name]
    text = (info.description or "").removesuffix(".").replace("%", "%%")  # argparse's format
    default = field_default(model, name)
    if default is not None and not isinstance(default, bool):
        text += " (default: %(default)s)"
    options: dict[str, Any] = {"default": default, "help": text[:1].lower() + text[1:]}
    values = typing.get_args(info.annotation)
    if typing.get_origin(info.annotation) is typing.Literal:
        options["choices"] = list(values)
    elif info.annotation in (int, float):
        options["type"] = info.annotation
    parser.add_argument(flag, **(options | kwargs))


def add_device_memory_argument(parser: argparse.ArgumentParser) -> None:
    """--device-memory-gib: `ClusterSpec.device_memory_bytes` in GiB."""
    default = field_default(ClusterSpec, "device_memory_bytes") / GIB
    parser.add_argument(
        "--device-memory-gib",
        type=float,
        default=default,
        help="memory of one device, GiB (default: %(default)s)",
    )


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """--search (`PlanOptions.search`) and --exhaustive, its shorthand for `--search
    exhaustive`; one or the other."""
    group = parser.add_mutually_exclusive_group()
    field_argument(group, "--search", PlanOptions, "search")
    group.add_argument(
        "--exhaustive",
        dest="search",
        action="store_const",
        const="exhaustive",
        default=argparse.SUPPRESS,
        help="measure every candidate (the same as --search exhaustive)",
    )


def add_measurement_arguments(parser: argparse.ArgumentParser) -> None:
    """--optimizer, --repeats, --max-repeats, --target-spread, --warmup (`PlanOptions`')."""
    field_argument(parser, "--optimizer", PlanOptions, "optimizer")
    field_argument(parser, "--repeats", PlanOptions, "repeats")
    field_argument(parser, "--max-repeats", PlanOptions, "max_repeats")
    field_argument(parser, "--target-spread", PlanOptions, "target_spread")
    field_argument(parser, "--warmup", PlanOptions, "warmup")


def measurement_options(args: argparse.Namespace) -> dict[str, Any]:
    """The `PlanOptions` fields those options set."""
    return {
        "optimizer": args.optimizer,
        "repeats": args.repeats,
        "max_repeats": max(args.repeats, args.max_repeats),
        "target_spread": args.target_spread,
        "warmup": args.warmup,
    }
