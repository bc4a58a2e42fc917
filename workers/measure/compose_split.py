"""A stage's backward split into B and W (zero-bubble schedules), from its layers' splits.

B = the layers' B parts in reverse: the stage's input cotangents, plus the *handoff*: each
layer's values that its W reads (`workers.measure.split`) and the cotangents of its outputs
that its W reads. W = the layers' W parts from the parameters, the stash and the handoff:
the parameter gradients (shared parameters summed). The handoff is what B keeps for W until
W runs; its per-device bytes are the stage's `weight_stash_size`.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax

from programs import load_layer
from schemas import FLOAT_DTYPES, LayerSpec, ModelSpec, VarSpec
from workers.measure.compose import StageProgram, residual_name
from workers.measure.split import LayerSplit, split_layer_backward

Arrays = Sequence[jax.Array]


@dataclass(frozen=True)
class _Step:
    """One layer of the reversed walk: its split and the output cotangents W reads."""

    layer: LayerSpec
    split: LayerSplit
    handed: tuple[str, ...]  # names of the layer's outputs whose cotangent B hands to W


@dataclass(frozen=True)
class SplitBackward:
    """`input_grad(params, stash, cotangents) -> (input cotangents, handoff)`;
    `weight_grad(params, stash, handoff) -> param grads` (both in `StageProgram` order)."""

    input_grad: Callable[[Arrays, Arrays, Arrays], tuple[list[jax.Array], tuple]]
    weight_grad: Callable[[Arrays, Arrays, Arrays], list[jax.Array]]
    handoff_names: tuple[str, ...]


def compose_split_backward(
    spec: ModelSpec, start: int, end: int, program: StageProgram
) -> SplitBackward:
    """Split `program`'s backward (the stage of layers start..end) into B and W."""
    layers = spec.layers[start : end + 1]
    param_names = [p.name for p in program.params]
    stash_names = [v.name for v in program.stash]
    output_names = [v.name for v in program.outputs]
    specs = {p.name: p for p in program.params}
    steps: list[_Step] = []
    has_ct = {output_names[i] for i in program.diff_outputs}
    handoff_names: list[str] = []
    for layer in reversed(layers):
        split = split_layer_backward(load_layer(layer)[1], len(layer.params))
        fixed = len(layer.params) + len(layer.saved) + len(layer.residuals)
        outs = _float_outputs(layer)
        handed = tuple(
            v.name
            for k, v in enumerate(outs)
            if v.name in has_ct and fixed + k in split.weight_reads
        )
        steps.append(_Step(layer, split, handed))
        handoff_names += [f"{layer.name}/grad:{n}" for n in handed]
        handoff_names += [f"{layer.name}/handoff{j}" for j in range(len(split.handoff))]
        has_ct.update(layer.grad_inputs)

    def layer_args(layer: LayerSpec, env: dict, ct: dict) -> list[jax.Array]:
        args = [env[p.name] for p in layer.params]
        args += [env[n] for n in layer.saved]
        args += [env[residual_name(layer, k)] for k in range(len(layer.residuals))]
        return args + [ct[v.name] if v.name in ct else _zeros(v) for v in _float_outputs(layer)]

    def input_grad(
        params: Arrays, stash: Arrays, cotangents: Arrays
    ) -> tuple[list[jax.Array], tuple]:
        env = dict(zip(param_names, params, strict=True))
        env.update(zip(stash_names, stash, strict=True))
        ct = {output_names[i]: g for i, g in zip(program.diff_outputs, cotangents, strict=True)}
        handoff: list[jax.Array] = []
        for step in steps:
            handoff += [ct[n] for n in step.handed]
            if step.split.input_grad is None:
                continue
            results = step.split.input_grad.call(*layer_args(step.layer, env, ct))
            n_in = len(step.layer.grad_inputs)
            for n, g in zip(step.layer.grad_inputs, results[:n_in], strict=True):
                ct[n] = ct[n] + g if n in ct else g
            handoff += results[n_in:]
        inputs = program.inputs
        return [
            ct[inputs[j].name] if inputs[j].name in ct else _zeros(inputs[j])
            for j in program.grad_inputs
        ], tuple(handoff)

    def weight_grad(params: Arrays, stash: Arrays, handoff: Arrays) -> list[jax.Array]:
        env = dict(zip(param_names, params, strict=True))
        env.update(zip(stash_names, stash, strict=True))
        rest = iter(handoff)
        grads: dict[str, jax.Array] = {}
        for step in steps:
            ct = {n: next(rest) for n in step.handed}
            cross = [next(rest) for _ in step.split.handoff]
            if step.split.weight_grad is None:
                continue
            results = step.split.weight_grad.call(*layer_args(step.layer, env, ct), *cross)
            for p, g in zip(step.layer.params, results, strict=True):
                grads[p.name] = grads[p.name] + g if p.name in grads else g
        return [grads[n] if n in grads else _zeros(specs[n]) for n in param_names]

    return SplitBackward(input_grad, weight_grad, tuple(handoff_names))


def _float_outputs(layer: LayerSpec) -> list[VarSpec]:
    return [v for v in layer.outputs if v.dtype in FLOAT_DTYPES]


def _zeros(v: VarSpec) -> jax.Array:
    return jax.numpy.zeros(v.shape, v.dtype)
