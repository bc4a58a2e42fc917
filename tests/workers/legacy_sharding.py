"""Reference: workers/measure/sharding.py as it was before mesh axes (commit a7ad1d8), kept
verbatim below the docstring so tests can check that today's three strategies shard exactly
as they did. Not used by the service."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from schemas import ParamSpec, ShardingConfig, VarSpec

DATA_AXIS = "data"
MODEL_AXIS = "model"
MESH_AXES = (DATA_AXIS, MODEL_AXIS)

# Logical axis name (ParamSpec.logical_axes) -> mesh axis it is split on under megatron.
LOGICAL_AXIS_RULES: dict[str, str] = {
    "mlp": MODEL_AXIS,
    "heads": MODEL_AXIS,
    "vocab": MODEL_AXIS,
    "experts": MODEL_AXIS,
}

ParamRule = Callable[[Sequence[ParamSpec], int, int], list[PartitionSpec]]


def _spec(rank: int, placement: dict[int, str]) -> PartitionSpec:
    """A PartitionSpec with mesh axis `placement[d]` on dim d (trailing unsplit dims left
    out, so a replicated array is `P()`)."""
    dims = [placement.get(d) for d in range(rank)]
    while dims and dims[-1] is None:
        dims.pop()
    return PartitionSpec(*dims)


def replicated_rule(params: Sequence[ParamSpec], dp: int, tp: int) -> list[PartitionSpec]:
    """`data`: every parameter replicated on the whole mesh."""
    return [PartitionSpec() for _ in params]


def _model_dims(params: Sequence[ParamSpec], tp: int) -> list[int | None]:
    """The dim of each parameter split on "model" (megatron), or None.

    Parameters with logical axis names use `LOGICAL_AXIS_RULES` (first matching dim divisible
    by tp). The others alternate column / row splits over consecutive 2-D matrices (column =
    last dim, row = first dim); a vector follows the preceding column split when its size
    equals that split dim; everything else is replicated.
    """
    dims: list[int | None] = []
    want_column = True
    last_column_size: int | None = None
    for p in params:
        dim: int | None = None
        if tp > 1 and p.logical_axes is not None:
            for d, name in enumerate(p.logical_axes):
                if name in LOGICAL_AXIS_RULES and p.shape[d] % tp == 0:
                    dim = d
                    break
        elif tp > 1 and len(p.shape) == 2:
            d = 1 if want_column else 0
            if p.shape[d] % tp == 0:
                dim = d
                last_column_size = p.shape[1] if want_column else None
                want_column = not want_column
        elif tp > 1 and len(p.shape) == 1 and p.shape[0] == last_column_size:
            dim = 0
        dims.append(dim)
    return dims


def megatron_rule(params: Sequence[ParamSpec], dp: int, tp: int) -> list[PartitionSpec]:
    """`megatron`: parameters split on "model" (see `_model_dims`), replicated over "data"."""
    return [
        _spec(len(p.shape), {} if d is None else {d: MODEL_AXIS})
        for p, d in zip(params, _model_dims(params, tp), strict=True)
    ]


def fsdp_rule(params: Sequence[ParamSpec], dp: int, tp: int) -> list[PartitionSpec]:
    """`fsdp`: the largest dim divisible by dp on "data", plus megatron's "model" split."""
    specs = []
    for p, model_dim in zip(params, _model_dims(params, tp), strict=True):
        placement = {} if model_dim is None else {model_dim: MODEL_AXIS}
        if dp > 1:
            free = [d for d in range(len(p.shape)) if d != model_dim and p.shape[d] % dp == 0]
            if free:
                placement[max(free, key=lambda d: (p.shape[d], -d))] = DATA_AXIS
        specs.append(_spec(len(p.shape), placement))
    return specs


PARAM_RULES: dict[str, ParamRule] = {
    "data": replicated_rule,
    "megatron": megatron_rule,
    "fsdp": fsdp_rule,
}


def batch_spec(var: VarSpec, dp: int) -> PartitionSpec:
    """Batch inputs and activations: dim 0 on "data" when dp > 1 divides it."""
    if dp > 1 and var.shape and var.shape[0] % dp == 0:
        return _spec(len(var.shape), {0: DATA_AXIS})
    return PartitionSpec()


@dataclass(frozen=True)
class StageShardings:
    """The mesh and the input shardings of one stage under one config."""

    mesh: Mesh
    params: list[NamedSharding]
    inputs: list[NamedSharding]

    def describe(self, params: Sequence[ParamSpec], inputs: Sequence[VarSpec]) -> dict[str, str]:
        """`{name: str(PartitionSpec)}` of every parameter and input."""
        out = {p.name: str(s.spec) for p, s in zip(params, self.params, strict=True)}
        out.update({v.name: str(s.spec) for v, s in zip(inputs, self.inputs, strict=True)})
        return out


def make_mesh(devices: Sequence[jax.Device], config: ShardingConfig) -> Mesh:
    """The logical mesh ``(dp, tp)`` over `devices` (exactly dp*tp of them)."""
    dp, tp = config.logical_mesh
    if len(devices) != dp * tp:
        raise ValueError(
            f"logical mesh {dp}x{tp} needs {dp * tp} devices, the submesh has {len(devices)}"
        )
    return Mesh(np.asarray(devices, dtype=object).reshape(dp, tp), MESH_AXES)


def stage_shardings(
    mesh: Mesh,
    config: ShardingConfig,
    params: Sequence[ParamSpec],
    inputs: Sequence[VarSpec],
) -> StageShardings:
    """Shardings of a stage's parameters (by the config's strategy) and inputs (batch dim)."""
    dp, tp = config.logical_mesh
    rule = PARAM_RULES[config.strategy]
    return StageShardings(
        mesh=mesh,
        params=[NamedSharding(mesh, s) for s in rule(params, dp, tp)],
        inputs=[NamedSharding(mesh, batch_spec(v, dp)) for v in inputs],
    )
