"""A spec with a symbolic batch dimension, instantiated at a concrete micro-batch size.

Every batch input's dim 0 becomes the new size, and each layer's inputs, outputs and
residuals take the shapes its forward gives at that size (`jax.eval_shape` of the
deserialized program, layer after layer); its FLOPs are the affine value through the two
traced sizes; each program is exported again at those shapes (`jax.export` refines the
symbolic module), so the stage built from it compiles, splits its backward and is
fingerprinted as a spec traced at that size. A stage's fingerprint (its layers' and the
micro-batch shapes) therefore differs between sizes.
"""

import base64
import dataclasses
import functools
from collections.abc import Collection, Sequence
from typing import Any

import jax
import numpy as np
from jax._src.interpreters import mlir as jax_mlir
from jaxlib.mlir import ir

from programs.check import expected_signatures, layer_forms
from programs.fingerprint import with_fingerprints
from programs.load import load_program
from programs.strip import strip_locations
from schemas import LayerSpec, ModelSpec, VarSpec


def spec_at_batch(spec: ModelSpec, size: int, variants: Collection[str] | None = None) -> ModelSpec:
    """`spec` stated at micro-batch `size`, its programs concrete (`symbolic_batch` null). A
    spec without a symbolic batch is only stated at its own size (itself). `variants`: the
    remat variants to state too (default: all; the others are dropped: each costs an export
    of its programs, and a layer's fingerprint does not read them). Raises ValueError when
    the spec has no symbolic batch dimension or a program rejects the size."""
    if variants is not None:
        spec = _keeping(spec, set(variants))
    poly = spec.symbolic_batch
    if poly is None and size == spec.micro_batch_size:
        return spec
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
        restated = {}
        for name, variant in layer.remat_variants.items():
            _, variant_res = _forward_shapes(layer, variant.forward, ins)
            restated[name] = variant.model_copy(
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
        if restated:
            update["remat_variants"] = restated
        layers.append(layer.model_copy(update=update))
    at_size = spec.model_copy(
        update={"inputs": inputs, "layers": [_concrete(x) for x in layers], "symbolic_batch": None}
    )
    return with_fingerprints(at_size)


def _keeping(spec: ModelSpec, variants: set[str]) -> ModelSpec:
    """`spec` with only the remat variants named in `variants`."""
    layers = [
        x.model_copy(
            update={"remat_variants": {n: v for n, v in x.remat_variants.items() if n in variants}}
        )
        for x in spec.layers
    ]
    return spec.model_copy(update={"layers": layers})


def _concrete(layer: LayerSpec) -> LayerSpec:
    """The layer with every program exported again at the shapes it states."""
    update: dict[str, Any] = {}
    variants = {}
    for prefix, form in layer_forms(layer):
        programs = {}
        for kind, (args, _) in expected_signatures(form).items():
            structs = tuple((tuple(v.shape), v.dtype) for _, v in args)
            programs[kind] = _export_at(getattr(form, kind), structs)
        if not prefix:
            update |= programs
        else:
            name = next(n for n in layer.remat_variants if repr(n) in prefix)
            variants[name] = layer.remat_variants[name].model_copy(update=programs)
    if variants:
        update["remat_variants"] = variants
    return layer.model_copy(update=update)


@functools.lru_cache(maxsize=1024)
def _export_at(program: str, structs: tuple[tuple[tuple[int, ...], str], ...]) -> str:
    """`program` exported again for arguments of these (shape, dtype)s, base64."""
    exp = load_program(program)
    args = [jax.ShapeDtypeStruct(shape, np.dtype(dtype)) for shape, dtype in structs]
    again = jax.export.export(jax.jit(exp.call), platforms=exp.platforms)(*args)
    # The module calls the symbolic one: refine its shapes, so no dynamic shape is left
    # for the workers (compile, split of the backward) or the fingerprint.
    with jax_mlir.make_ir_context():
        module = jax_mlir.refine_polymorphic_shapes(ir.Module.parse(again.mlir_module()))
        refined = jax_mlir.module_to_bytecode(module)
    again = dataclasses.replace(again, mlir_module_serialized=refined)
    return base64.b64encode(strip_locations(again.serialize())).decode("ascii")


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
