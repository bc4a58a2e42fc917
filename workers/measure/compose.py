"""Compose a stage from a `ModelSpec`'s layer program pairs (deserialized `jax.export`s).

A stage's forward runs its layers' forwards in order and returns, beside the stage outputs,
its *stash*: every residual of its layers and every var a layer's backward reads (`saved`),
once each. Its backward runs the layers' backwards in reverse from the stash and the output
cotangents, summing cotangents of vars read by several layers and grads of shared params.
Nothing is recomputed that a training step keeps (see `schemas.model` for the convention).
"""

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp

import programs
from programs import load_layer
from schemas import FLOAT_DTYPES, LayerSpec, ModelSpec, ParamSpec, VarSpec
from workers.measure.fingerprint import stage_io

log = logging.getLogger(__name__)


Arrays = Sequence[jax.Array]


@dataclass(frozen=True)
class StageProgram:
    """Layers start..end as a forward and a backward function.

    `forward(params, inputs) -> (outputs, stash)`;
    `backward(params, stash, cotangents) -> (param grads, input cotangents)` with cotangents
    for `outputs[i]` for i in `diff_outputs` and input cotangents for `inputs[j]` for j in
    `grad_inputs`."""

    params: list[ParamSpec]  # every layer's params, in layer order (shared ones once)
    inputs: list[VarSpec]  # vars read from outside the stage, in order of first use
    outputs: list[VarSpec]  # vars used after `end` (or the loss), in production order
    stash: list[VarSpec]  # what forward keeps for backward: saved vars, then residuals
    diff_outputs: list[int]
    grad_inputs: list[int]
    forward: Callable[[Arrays, Arrays], tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]]
    backward: Callable[[Arrays, Arrays, Arrays], tuple[list[jax.Array], list[jax.Array]]]

    def fn(self, param_values: Arrays, input_values: Arrays) -> tuple[jax.Array, ...]:
        """The stage's outputs alone."""
        return self.forward(param_values, input_values)[0]


def residual_name(layer: LayerSpec, k: int) -> str:
    """The stash name of residual `k` of `layer` (layer names are unique in a spec)."""
    return f"{layer.name}/{layer.residuals[k].name}"


def stage_stash(layers: Sequence[LayerSpec]) -> list[VarSpec]:
    """What a stage of `layers` keeps from forward to backward: the vars its layers'
    backwards read (once each, in order of first use), then every layer's residuals."""
    by_name = {v.name: v for layer in layers for v in [*layer.inputs, *layer.outputs]}
    saved = dict.fromkeys(n for layer in layers for n in layer.saved)
    stash = [by_name[n] for n in saved]
    for layer in layers:
        stash += [
            VarSpec(name=residual_name(layer, k), shape=r.shape, dtype=r.dtype)
            for k, r in enumerate(layer.residuals)
        ]
    return stash


Constrain = Callable[[VarSpec, jax.Array], jax.Array]


def compose_stage(
    spec: ModelSpec, start: int, end: int, constrain: Constrain | None = None
) -> StageProgram:
    """The stage of layers `start..end` (inclusive) as jittable forward and backward.
    `constrain(var, value)`, when given, places each layer output the forward makes (e.g. a
    sharding constraint by the config's activation rules)."""
    if not 0 <= start <= end < spec.num_layers:
        raise ValueError(f"bad layer range {start}..{end} for {spec.num_layers} layers")
    layers = spec.layers[start : end + 1]
    params: dict[str, ParamSpec] = {}
    for layer in layers:
        for p in layer.params:
            params.setdefault(p.name, p)
    inputs, outputs = stage_io(spec, start, end)
    stash = stage_stash(layers)
    pairs = [load_layer(layer) for layer in layers]
    param_names = list(params)
    input_names = [v.name for v in inputs]
    output_names = [v.name for v in outputs]
    stash_names = [v.name for v in stash]
    differentiated = {n for layer in layers for n in layer.grad_inputs}
    diff_outputs = [i for i, v in enumerate(outputs) if v.dtype in FLOAT_DTYPES]
    grad_inputs = [j for j, v in enumerate(inputs) if v.name in differentiated]

    def forward(param_values: Arrays, input_values: Arrays) -> tuple[tuple, tuple]:
        env = dict(zip(param_names, param_values, strict=True))
        env.update(zip(input_names, input_values, strict=True))
        for layer, (fwd, _) in zip(layers, pairs, strict=True):
            args = [env[p.name] for p in layer.params] + [env[v.name] for v in layer.inputs]
            results = fwd.call(*args)
            n_out = len(layer.outputs)
            for v, value in zip(layer.outputs, results[:n_out], strict=True):
                env[v.name] = value if constrain is None else constrain(v, value)
            for k, r in enumerate(results[n_out:]):
                env[residual_name(layer, k)] = r
        return tuple(env[n] for n in output_names), tuple(env[n] for n in stash_names)

    def backward(
        param_values: Arrays, stash_values: Arrays, cotangents: Arrays
    ) -> tuple[list[jax.Array], list[jax.Array]]:
        env = dict(zip(param_names, param_values, strict=True))
        env.update(zip(stash_names, stash_values, strict=True))
        ct: dict[str, jax.Array] = {}
        for i, g in zip(diff_outputs, cotangents, strict=True):
            ct[output_names[i]] = g
        grads: dict[str, jax.Array] = {}
        for layer, (_, bwd) in zip(reversed(layers), reversed(pairs), strict=True):
            outs = [v for v in layer.outputs if v.dtype in FLOAT_DTYPES]
            args = [env[p.name] for p in layer.params]
            args += [env[n] for n in layer.saved]
            args += [env[residual_name(layer, k)] for k in range(len(layer.residuals))]
            args += [ct[v.name] if v.name in ct else _zeros(v) for v in outs]
            results = bwd.call(*args)
            n_p = len(layer.params)
            for p, g in zip(layer.params, results[:n_p], strict=True):
                grads[p.name] = grads[p.name] + g if p.name in grads else g
            for n, g in zip(layer.grad_inputs, results[n_p:], strict=True):
                ct[n] = ct[n] + g if n in ct else g
        return (
            [grads[n] if n in grads else _zeros(params[n]) for n in param_names],
            [
                ct[inputs[j].name] if inputs[j].name in ct else _zeros(inputs[j])
                for j in grad_inputs
            ],
        )

    return StageProgram(
        params=list(params.values()),
        inputs=inputs,
        outputs=outputs,
        stash=stash,
        diff_outputs=diff_outputs,
        grad_inputs=grad_inputs,
        forward=forward,
        backward=backward,
    )


def _zeros(v: VarSpec) -> jax.Array:
    return jnp.zeros(v.shape, v.dtype)


def check_programs(spec: ModelSpec) -> list[str]:
    """Deserialize every layer's forward and backward and compare their signatures with the
    declared vars and this worker's platform. One message per violation, naming the layer
    and field."""
    platform = programs.platform_problems(spec, jax.export.default_export_platform())
    return [str(p) for p in platform + programs.check_programs(spec)]
