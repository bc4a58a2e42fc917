"""Sharding configs as data: a size per named mesh axis plus a logical-axis rule table.

A `ShardingStrategy` is MaxText's `mesh_axes` / `ici_*` sizes and `logical_axis_rules` in one
value: `mesh_axes` gives each named axis (data, fsdp, tensor, context, expert) a size, at most
one of them -1 (filled as MaxText's `fill_unspecified_mesh_axes` does); `rules` maps a logical
axis name (of a parameter dim, or `batch` / `length` for activations) to the mesh axes it is
split over. Today's three strategies (`data`, `megatron`, `fsdp` on a `(dp, tp)` mesh) are
three rule tables of this space (`LEGACY_RULES`); MaxText's defaults are `RULE_PRESETS`.

How a rule table lays out an array (`workers.measure.sharding` applies it):
- a parameter dim with a logical name gets its rule's mesh axes, leaving out axes of size 1,
  axes an earlier dim of the same array already uses (MaxText lists a second, shorter rule
  for such names instead), and axes whose product would not divide the dim;
- `"*"` (ours): mesh axes that also split each parameter's largest free dim where the named
  rules left the parameter unsplit on them (ZeRO-3; today's `fsdp`);
- a parameter without logical names keeps the structural fallback: consecutive matrices
  alternate column / row splits on `tensor` when a parameter rule uses `tensor`, and the
  largest free dim goes on `fsdp` when a parameter rule uses `fsdp`;
- activations (stage inputs and outputs, the vars a stage keeps): dim 0 by `batch`, the
  sequence dim by `length`.
"""

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from schemas.base import Frozen

MeshAxisName = Literal["data", "fsdp", "tensor", "context", "expert"]
# Device order of a mesh, outermost first: tensor innermost (contiguous devices, so within a
# host), data outermost (across hosts first), as MaxText orders `mesh_axes`.
MESH_AXES: tuple[str, ...] = ("data", "fsdp", "context", "expert", "tensor")
BATCH_RULE = "batch"
LENGTH_RULE = "length"
LARGEST_DIM_RULE = "*"
ACTIVATION_RULES = frozenset({BATCH_RULE, LENGTH_RULE})
STRATEGY_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.\-]{0,31}$"
MAX_RULES = 256

Rules = dict[str, tuple[str, ...]]

# MaxText's default `logical_axis_rules`, restricted to our five mesh axes (the axes we do not
# model, stage / fsdp_transpose / tensor_sequence / context_usp_ulysses / autoregressive, are
# left out of each rule): AI-Hypercomputer/maxtext src/maxtext/configs/base.yml at commit
# e591f30cbbf217ed67ef71263ec0538239f9c3b8 (2026-08-22). `batch` is its `activation_batch`,
# `length` its `activation_length`; `experts` is the zoo's name for its `exp`.
MAXTEXT_RULES: Rules = {
    BATCH_RULE: ("data", "fsdp", "expert"),
    LENGTH_RULE: ("context",),
    "vocab": ("tensor",),
    "embed": ("fsdp", "context", "expert"),
    "heads": ("tensor",),
    "q_heads": ("tensor",),
    "kv_heads": ("tensor",),
    "mlp": ("tensor",),
    "norm": ("tensor",),
    "exp": ("expert",),
    "experts": ("expert",),
    "embed_moe": ("fsdp", "context"),
    "mlp_moe": ("tensor",),
}

# custom_mesh_and_rule/pure-fsdp.yml at the same commit: everything on fsdp.
PURE_FSDP_RULES: Rules = {
    BATCH_RULE: ("fsdp",),
    "embed": ("fsdp",),
    "embed_vocab": ("fsdp",),
    "embed_moe": ("fsdp",),
}

RULE_PRESETS: dict[str, Rules] = {"maxtext": MAXTEXT_RULES, "pure-fsdp": PURE_FSDP_RULES}

_TENSOR_RULES: Rules = {n: ("tensor",) for n in ("mlp", "heads", "vocab", "experts")}
# Today's strategies as rule tables, each on the mesh `LEGACY_AXES` names: `data` replicates
# every parameter; `megatron` splits the first mlp/heads/vocab/experts dim (or, unnamed,
# alternating matrix columns and rows) on tensor; `fsdp` adds each parameter's largest free
# dim on fsdp. Batch dim 0 on the dp-sized axis, no sequence split.
LEGACY_RULES: dict[str, Rules] = {
    "data": {BATCH_RULE: ("data",)},
    "megatron": {BATCH_RULE: ("data",), **_TENSOR_RULES},
    "fsdp": {BATCH_RULE: ("fsdp",), **_TENSOR_RULES, LARGEST_DIM_RULE: ("fsdp",)},
}
# The mesh axis a legacy strategy's `dp` is (its `tp` is always tensor).
LEGACY_DP_AXIS: dict[str, str] = {"data": "data", "megatron": "data", "fsdp": "fsdp"}


def rule_errors(rules: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Problems of a rule table, each naming the logical name: an unknown mesh axis, or a
    mesh axis listed twice in one rule."""
    errors = []
    for name, axes in rules.items():
        unknown = [a for a in axes if a not in MESH_AXES]
        if unknown:
            errors.append(
                f"rule {name!r}: unknown mesh axis {unknown[0]!r}; use names of {list(MESH_AXES)}"
            )
        twice = sorted({a for a in axes if list(axes).count(a) > 1})
        if twice:
            errors.append(f"rule {name!r}: mesh axis {twice[0]!r} is used twice")
    return errors


def _check_rules(v: Rules) -> Rules:
    if len(v) > MAX_RULES:
        raise ValueError(f"at most {MAX_RULES} rules")
    errors = rule_errors(v)
    if errors:
        raise ValueError("; ".join(errors))
    return v


def fill_mesh_axes(
    sizes: Mapping[str, int] | Mapping[MeshAxisName, int], num_devices: int
) -> dict[str, int]:
    """Every mesh axis's size on `num_devices` devices: `sizes` with a missing axis 1 and the
    one -1 axis (if any) filled so that the product is `num_devices` (MaxText's
    `fill_unspecified_mesh_axes`). Raises ValueError naming the problem."""
    given: dict[str, int] = {str(a): int(s) for a, s in sizes.items()}
    unknown = sorted(set(given) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"unknown mesh axis {unknown[0]!r}; use names of {list(MESH_AXES)}")
    free = [a for a, s in given.items() if s == -1]
    if len(free) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {free}")
    bad = [a for a, s in given.items() if s < 1 and s != -1]
    if bad:
        raise ValueError(f"mesh axis {bad[0]!r} must be >= 1 or -1, got {given[bad[0]]}")
    fixed = math.prod(s for s in given.values() if s != -1)
    out = {a: given.get(a, 1) for a in MESH_AXES}
    if free:
        if num_devices % fixed:
            raise ValueError(
                f"the fixed mesh axes' product {fixed} does not divide the {num_devices} devices"
            )
        out[free[0]] = num_devices // fixed
    elif fixed != num_devices:
        raise ValueError(f"the mesh axes' product is {fixed}, not the {num_devices} devices")
    return out


class ShardingStrategy(Frozen):
    """A sharding config as data: mesh axis sizes (product = the submesh's devices; one may
    be -1) and logical-axis rules (logical name -> mesh axes; see the module doc)."""

    name: str = Field(
        description="Its name (shown as the stage's strategy): letters, digits, _.-, "
        "at most 32 characters.",
        json_schema_extra={"pattern": STRATEGY_NAME_PATTERN},
    )
    mesh_axes: dict[MeshAxisName, int] = Field(
        description="Size per mesh axis (data, fsdp, tensor, context, expert; a missing axis "
        "is 1); at most one -1, filled so that the product is the submesh's devices.",
    )
    rules: Rules = Field(
        default_factory=lambda: dict(MAXTEXT_RULES),
        description="Logical axis name -> mesh axes it is split over, in order (MaxText's "
        "logical_axis_rules): 'batch' and 'length' for activations, '*' for every parameter's "
        "largest free dim; default MaxText's rules.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(STRATEGY_NAME_PATTERN, v):
            raise ValueError(
                f"{v!r} is not a valid strategy name: a letter or '_' first, then at most 31 "
                "letters, digits or _.-"
            )
        return v

    @field_validator("mesh_axes")
    @classmethod
    def _sizes(cls, v: dict[str, int]) -> dict[str, int]:
        free = [a for a, s in v.items() if s == -1]
        if len(free) > 1:
            raise ValueError(f"at most one mesh axis may be -1, got {free}")
        bad = [a for a, s in v.items() if s < 1 and s != -1]
        if bad:
            raise ValueError(f"mesh axis {bad[0]!r} must be >= 1 or -1, got {v[bad[0]]}")
        return v

    @field_validator("rules")
    @classmethod
    def _rules(cls, v: Rules) -> Rules:
        return _check_rules(v)

    def fits(self, num_devices: int) -> bool:
        """Whether its sizes resolve on `num_devices` devices."""
        try:
            fill_mesh_axes(self.mesh_axes, num_devices)
        except ValueError:
            return False
        return True


def axes_label(sizes: Mapping[str, int]) -> str:
    """`data2.tensor2` (the axes larger than 1, in mesh order; `1` when none is)."""
    parts = [f"{a}{sizes[a]}" for a in MESH_AXES if sizes.get(a, 1) > 1]
    return ".".join(parts) or "1"


def check_rule_table(v: str | Rules) -> str | Rules:
    """A preset name (of `RULE_PRESETS`) or a rule table, checked."""
    if isinstance(v, str):
        if v not in RULE_PRESETS:
            raise ValueError(f"unknown rule preset {v!r}; use one of {sorted(RULE_PRESETS)}")
        return v
    return _check_rules(v)


def resolve_rules(v: str | Rules) -> Rules:
    """The rule table a preset name or table stands for."""
    return dict(RULE_PRESETS[v]) if isinstance(v, str) else dict(v)


EXPERT_NAMES = frozenset({"exp", "experts"})
INTEGER_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint64", "uint32", "uint16"})


@dataclass(frozen=True)
class MeshFacts:
    """What of a model the mesh-axes search needs: whether it has a sequence dim (context
    parallelism splits it) and parameters with an experts axis (expert parallelism splits
    them). The defaults, both True, stand for a model not known yet (an upper bound)."""

    sequence: bool = True
    experts: bool = True

    @classmethod
    def of(
        cls,
        inputs: Sequence[tuple[Sequence[int], str]],
        param_axes: Iterable[Sequence[str | None] | None],
    ) -> "MeshFacts":
        """From the model's batch inputs `(shape, dtype)` (a sequence: integer rank-2 inputs,
        token ids) and its parameters' logical axes."""
        sequence = any(dtype in INTEGER_DTYPES and len(shape) == 2 for shape, dtype in inputs)
        experts = any(axes and EXPERT_NAMES & set(axes) for axes in param_axes)
        return cls(sequence=sequence, experts=bool(experts))


# A mesh point of the searched space splits at most this many axes (bounded, as MaxText's
# recipes: one or two of data / fsdp / tensor / context / expert).
MAX_SPLIT_AXES = 2


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def mesh_points(
    hosts: int,
    devices_per_host: int,
    micro_batch_size: int,
    axes: Sequence[str],
    tensor_across_hosts: bool = False,
    facts: MeshFacts = MeshFacts(),
) -> list[dict[str, int]]:
    """The mesh-axis sizes searched on a `hosts` x `devices_per_host` submesh, each a dict of
    every mesh axis (product = the devices), in a fixed order (fewest split axes first, then
    by the sizes in mesh order, largest first).

    Only `axes` may be larger than 1, at most `MAX_SPLIT_AXES` of them; the batch axes
    (data x fsdp x expert) divide the micro-batch; `tensor` stays within a host (divides
    `devices_per_host`) unless `tensor_across_hosts`; data and fsdp split together only as
    MaxText's hybrid: data across the hosts (`data == hosts`), fsdp within them; context only
    for a model with a sequence, expert only for one with experts (`facts`).
    """
    n = hosts * devices_per_host
    wanted = [a for a in MESH_AXES if a in axes]
    points: list[dict[str, int]] = []

    def extend(i: int, left: int, sizes: dict[str, int]) -> None:
        if i == len(wanted):
            if left == 1:
                points.append({a: sizes.get(a, 1) for a in MESH_AXES})
            return
        for d in _divisors(left):
            extend(i + 1, left // d, {**sizes, wanted[i]: d} if d > 1 else sizes)

    extend(0, n, {})
    kept = []
    for p in points:
        split = [a for a in MESH_AXES if p[a] > 1]
        if len(split) > MAX_SPLIT_AXES:
            continue
        if micro_batch_size % (p["data"] * p["fsdp"] * p["expert"]):
            continue
        if not tensor_across_hosts and devices_per_host % p["tensor"]:
            continue
        if p["data"] > 1 and p["fsdp"] > 1 and (hosts == 1 or p["data"] != hosts):
            continue
        if (p["context"] > 1 and not facts.sequence) or (p["expert"] > 1 and not facts.experts):
            continue
        kept.append(p)
    kept.sort(key=lambda p: (sum(s > 1 for s in p.values()), [-p[a] for a in MESH_AXES]))
    return kept
