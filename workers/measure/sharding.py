"""Where each parameter and activation of a stage lives on its mesh, by the config's rules.

A stage's mesh has the five named axes of `schemas.sharding.MESH_AXES` (data, fsdp, context,
expert, tensor; sizes from `ShardingConfig.axis_sizes`, tensor innermost). Its config's rule
table (`ShardingConfig.layout_rules`; today's `data` / `megatron` / `fsdp` are the tables of
`schemas.sharding.LEGACY_RULES`) gives each array its `PartitionSpec`, as the module doc of
`schemas.sharding` says: parameters by their logical axis names (a structural fallback for
those without), activations by `batch` (dim 0) and `length` (the sequence dim). The
partitioner propagates everything else.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from schemas import ModelSpec, ParamSpec, ShardingConfig, VarSpec
from schemas.sharding import (
    ACTIVATION_RULES,
    BATCH_RULE,
    LARGEST_DIM_RULE,
    LENGTH_RULE,
    MESH_AXES,
)

TENSOR_AXIS = "tensor"
FSDP_AXIS = "fsdp"
INTEGER_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint64", "uint32", "uint16"})

Placement = dict[int, tuple[str, ...]]


def _spec(rank: int, placement: Placement) -> PartitionSpec:
    """A PartitionSpec with mesh axes `placement[d]` on dim d (one axis as its name, trailing
    unsplit dims left out, so a replicated array is `P()`)."""
    dims: list[str | tuple[str, ...] | None] = []
    for d in range(rank):
        axes = placement.get(d, ())
        dims.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    while dims and dims[-1] is None:
        dims.pop()
    return PartitionSpec(*dims)


def _fit(size: int, axes: Iterable[str], sizes: Mapping[str, int], used: set[str]) -> tuple:
    """The axes of a rule a dim of `size` takes: size > 1, not used by the array yet, and
    their product dividing the dim (an axis that would not divide is left out)."""
    out: list[str] = []
    product = 1
    for a in axes:
        s = sizes[a]
        if s > 1 and a not in used and size % (product * s) == 0:
            out.append(a)
            product *= s
    return tuple(out)


def _tensor_fallback(params: Sequence[ParamSpec], tensor: int) -> list[int | None]:
    """The dim of each parameter without logical names split on tensor, or None: consecutive
    2-D matrices alternate column (last dim) and row (first dim) splits; a vector follows the
    preceding column split when its size equals that split dim. Named parameters: None."""
    dims: list[int | None] = []
    want_column = True
    last_column_size: int | None = None
    for p in params:
        dim: int | None = None
        if tensor > 1 and p.logical_axes is None:
            if len(p.shape) == 2:
                d = 1 if want_column else 0
                if p.shape[d] % tensor == 0:
                    dim = d
                    last_column_size = p.shape[1] if want_column else None
                    want_column = not want_column
            elif len(p.shape) == 1 and p.shape[0] == last_column_size:
                dim = 0
        dims.append(dim)
    return dims


def _largest_free(p: ParamSpec, placement: Placement, axis: str, size: int) -> None:
    """Put `axis` on the parameter's largest dim that no axis splits yet and `size` divides."""
    if size <= 1 or any(axis in axes for axes in placement.values()):
        return
    free = [d for d in range(len(p.shape)) if d not in placement and p.shape[d] % size == 0]
    if free:
        placement[max(free, key=lambda d: (p.shape[d], -d))] = (axis,)


def param_specs(
    params: Sequence[ParamSpec], sizes: Mapping[str, int], rules: Mapping[str, Sequence[str]]
) -> list[PartitionSpec]:
    """Each parameter's PartitionSpec under mesh axis `sizes` and rule table `rules`."""
    param_axes = {a for name, axes in rules.items() if name not in ACTIVATION_RULES for a in axes}
    largest = list(rules.get(LARGEST_DIM_RULE, ()))
    fallback_largest = ([FSDP_AXIS] if FSDP_AXIS in param_axes else []) + largest
    tensor = sizes[TENSOR_AXIS] if TENSOR_AXIS in param_axes else 1
    tensor_dims = _tensor_fallback(params, tensor)
    specs = []
    for p, tensor_dim in zip(params, tensor_dims, strict=True):
        placement: Placement = {}
        if p.logical_axes is not None:
            used: set[str] = set()
            for d, name in enumerate(p.logical_axes):
                axes = _fit(p.shape[d], rules.get(name, ()) if name else (), sizes, used)
                if axes:
                    placement[d] = axes
                    used.update(axes)
            extra = largest
        else:
            if tensor_dim is not None:
                placement[tensor_dim] = (TENSOR_AXIS,)
            extra = fallback_largest
        for axis in dict.fromkeys(extra):
            _largest_free(p, placement, axis, sizes[axis])
        specs.append(_spec(len(p.shape), placement))
    return specs


def sequence_length(spec: ModelSpec) -> int | None:
    """The model's sequence length: dim 1 of its integer rank-2 batch inputs (token ids,
    labels), when they agree; None for a model without one (no context parallelism)."""
    lengths = {v.shape[1] for v in spec.inputs if v.dtype in INTEGER_DTYPES and len(v.shape) == 2}
    return lengths.pop() if len(lengths) == 1 else None


def activation_spec(
    var: VarSpec,
    sizes: Mapping[str, int],
    rules: Mapping[str, Sequence[str]],
    seq_len: int | None = None,
) -> PartitionSpec:
    """An activation's PartitionSpec: dim 0 by the `batch` rule; dim 1, when it is the
    sequence (`seq_len`, rank >= 2), by the `length` rule."""
    placement: Placement = {}
    used: set[str] = set()
    if var.shape:
        axes = _fit(var.shape[0], rules.get(BATCH_RULE, ()), sizes, used)
        if axes:
            placement[0] = axes
            used.update(axes)
    if seq_len is not None and len(var.shape) >= 2 and var.shape[1] == seq_len:
        axes = _fit(var.shape[1], rules.get(LENGTH_RULE, ()), sizes, used)
        if axes:
            placement[1] = axes
    return _spec(len(var.shape), placement)


def config_param_specs(config: ShardingConfig, params: Sequence[ParamSpec]) -> list[PartitionSpec]:
    """`param_specs` under a config's sizes and rules."""
    return param_specs(params, config.axis_sizes, config.layout_rules)


@dataclass(frozen=True)
class StageShardings:
    """The mesh and the input shardings of one stage under one config."""

    mesh: Mesh
    params: list[NamedSharding]
    inputs: list[NamedSharding]
    rules: Mapping[str, Sequence[str]]
    seq_len: int | None = None

    def describe(self, params: Sequence[ParamSpec], inputs: Sequence[VarSpec]) -> dict[str, str]:
        """`{name: str(PartitionSpec)}` of every parameter and input."""
        out = {p.name: str(s.spec) for p, s in zip(params, self.params, strict=True)}
        out.update({v.name: str(s.spec) for v, s in zip(inputs, self.inputs, strict=True)})
        return out

    def activation(self, var: VarSpec) -> NamedSharding:
        """Where an activation of this stage lives (batch and sequence rules)."""
        sizes = dict(self.mesh.shape)
        return NamedSharding(self.mesh, activation_spec(var, sizes, self.rules, self.seq_len))


def activation_constraint(
    mesh: Mesh, config: ShardingConfig, seq_len: int | None
) -> Callable[[VarSpec, jax.Array], jax.Array]:
    """`(var, value) -> value` constrained to the config's activation rules on `mesh` (for
    `compose_stage`: the activations a stage keeps follow the batch / sequence rules)."""
    sizes, rules = dict(mesh.shape), config.layout_rules

    def constrain(var: VarSpec, value: jax.Array) -> jax.Array:
        spec = activation_spec(var, sizes, rules, seq_len)
        return jax.lax.with_sharding_constraint(value, NamedSharding(mesh, spec))

    return constrain


def make_mesh(devices: Sequence[jax.Device], config: ShardingConfig) -> Mesh:
    """The config's mesh over `devices` (exactly as many as its axes' product), axes in
    `MESH_AXES` order."""
    sizes = config.axis_sizes
    shape = tuple(sizes[a] for a in MESH_AXES)
    if len(devices) != int(np.prod(shape)):
        raise ValueError(
            f"mesh {config.label()} needs {int(np.prod(shape))} devices, the submesh has "
            f"{len(devices)}"
        )
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), MESH_AXES)


def stage_shardings(
    mesh: Mesh,
    config: ShardingConfig,
    params: Sequence[ParamSpec],
    inputs: Sequence[VarSpec],
    seq_len: int | None = None,
) -> StageShardings:
    """Shardings of a stage's parameters and inputs under the config's rules (`seq_len`:
    the model's sequence length, see `sequence_length`)."""
    rules = config.layout_rules
    sizes = dict(mesh.shape)
    return StageShardings(
        mesh=mesh,
        params=[NamedSharding(mesh, s) for s in param_specs(params, sizes, rules)],
        inputs=[NamedSharding(mesh, activation_spec(v, sizes, rules, seq_len)) for v in inputs],
        rules=rules,
        seq_len=seq_len,
    )
