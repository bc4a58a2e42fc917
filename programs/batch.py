"""A spec with a symbolic batch dimension, instantiated at a concrete micro-batch size.

The programs stay shape-polymorphic (`jax.export` refines them when called with concrete
arrays); what changes is what the spec states: every batch input's dim 0 is the new size,
and each layer's inputs, outputs and residuals take the shapes its forward gives at that size
(`jax.eval_shape` of the deserialized program, layer after layer), its FLOPs the affine value
through the two traced sizes, and its fingerprint the one those shapes give. So a stage's
fingerprint (built from its layers' and the micro-batch shapes) differs between sizes, and
the same spec traced at that size measures the same.
"""

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from programs.fingerprint import with_fingerprints
from programs.load import load_program
from schemas import LayerSpec, ModelSpec, VarSpec


def spec_at_batch(spec: ModelSpec, size: int) -> ModelSpec:
    """`spec` stated at micro-batch `size` (itself at its traced size). Raises ValueError when
    the spec has no symbolic batch dimension or a program rejects the size."""
    if size == spec.micro_batch_size:
        return spec
    poly = spec.symbolic_batch
    if poly is None:
        raise ValueError(
            f"the model was traced at micro-batch {spec.micro_batch_size} without a symbolic "
            f"batch dimension; trace it at {size} (or with client.trace_symbolic_batch)"
        )
    if size < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {size}")
    k0, k1 = spec.micro_batch_size, poly.probe_size
    env: dict[str, VarSpec] = {}
    inputs = [v.model_copy(update={"shape": (size, *v.shape[1:])}) for v in spec.inputs]
    env.update((v.name, v) for v in inputs)
    layers = []
    for layer, probe in zip(spec.layers, poly.probe_flops, strict=True):
        at = _Affine(k0, k1, size)
        ins = [env[v.name] for v in layer.inputs]
        outs, residuals = _forward_shapes(layer, layer.forward, ins)
        env.update((v.name, v) for v in outs)
        variants = {}
        for name, variant in layer.remat_variants.items():
            _, variant_res = _forward_shapes(layer, variant.forward, ins)
            variants[name] = variant.model_copy(
                update={
                    "residuals": variant_res,
                    "backward_flops": at(variant.backward_flops, probe.variants.get(name, 0.0)),
                }
            )
        update: dict[str, Any] = {
            "inputs": ins,
            "outputs": outs,
            "residuals": residuals,
            "flops": at(layer.flops, probe.forward),
            "backward_flops": at(layer.backward_flops, probe.backward),
        }
        if variants:
            update["remat_variants"] = variants
        layers.append(layer.model_copy(update=update))
    probe_flops = [
        p.model_copy(
            update={
                "forward": layer.flops,
                "backward": layer.backward_flops,
                "variants": {n: v.backward_flops for n, v in layer.remat_variants.items()},
            }
        )
        for layer, p in zip(spec.layers, poly.probe_flops, strict=True)
    ]
    # Restated at `size`, the original traced size becomes the second point.
    facts = poly.model_copy(update={"probe_size": k0, "probe_flops": probe_flops})
    at_size = spec.model_copy(update={"inputs": inputs, "layers": layers, "symbolic_batch": facts})
    return with_fingerprints(at_size)


class _Affine:
    """FLOPs at `size` from their values at k0 and k1 (affine in the batch)."""

    def __init__(self, k0: int, k1: int, size: int) -> None:
        self.k0, self.k1, self.size = k0, k1, size

    def __call__(self, at_k0: float, at_k1: float) -> float:
        value = at_k0 + (at_k1 - at_k0) * (self.size - self.k0) / (self.k1 - self.k0)
        return max(0.0, float(value))


def _forward_shapes(
    layer: LayerSpec, forward: str, inputs: Sequence[VarSpec]
) -> tuple[list[VarSpec], list[VarSpec]]:
    """The layer's outputs and residuals as its (symbolic) forward gives them for `inputs`."""
    exp = load_program(forward)
    args = [_struct(p) for p in layer.params] + [_struct(v) for v in inputs]
    try:
        results = jax.eval_shape(exp.call, *args)
    except Exception as e:  # noqa: BLE001 - any refusal of the shapes: the size is bad
        raise ValueError(
            f"layer {layer.name!r} does not run at these shapes "
            f"({[tuple(a.shape) for a in args[len(layer.params) :]]}): {e}"
        ) from e
    n_out = len(layer.outputs)
    outs = [
        v.model_copy(update={"shape": tuple(r.shape)})
        for v, r in zip(layer.outputs, results[:n_out], strict=True)
    ]
    residual_vars = layer.residuals
    if forward != layer.forward:  # a remat variant's forward
        residual_vars = next(
            v.residuals for v in layer.remat_variants.values() if v.forward == forward
        )
    residuals = [
        v.model_copy(update={"shape": tuple(r.shape)})
        for v, r in zip(residual_vars, results[n_out:], strict=True)
    ]
    return outs, residuals


def _struct(v: VarSpec) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(v.shape), np.dtype(v.dtype))
