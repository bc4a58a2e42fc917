"""Layers exported with a symbolic batch dimension, so one spec serves every micro-batch size.

`trace_symbolic_batch(loss_fn, params, batch)` traces the loss twice with the same tracer
(`client.trace`): at the given micro-batch size k0 and at 2·k0. The two traces give the same
layers with the same equations; every integer that differs between them (a shape in
`reshape`/`broadcast_in_dim`/`iota`, a literal such as the count a mean divides by) is an
affine function a·b + c of the batch size, solved from the two points. Each layer is then
exported once more with its batch dims as `jax.export.symbolic_shape("b")`, its equations
re-bound with those symbolic params, so the forward and backward programs are
shape-polymorphic (jax.export shape polymorphism).

The spec keeps everything else at k0 (shapes, residuals, FLOPs, fingerprints): a worker
instantiates it at a size k with `programs.spec_at_batch`, and each layer's FLOPs at k come
from the two traced points (`ModelSpec.symbolic_batch`).

A model whose layers are not affine in the batch (a constant array whose shape depends on
it, a value such as 1/k, different equations at the two sizes) raises `NotBatchPolymorphic`
naming the layer and why: trace it at each size instead (`client.trace`).
"""

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from client.batch_affine import BatchPoints, Generalized, NotBatchPolymorphic
from client.export import ExportCall, LayerPrograms, export_layer_pair, recording_exports
from client.tracing import trace
from schemas import LayerBatchFlops, ModelSpec, SymbolicBatch

SYMBOL = "b"
__all__ = ["NotBatchPolymorphic", "build_zoo_symbolic", "trace_symbolic_batch"]


def trace_symbolic_batch(
    loss_fn: Callable[[Any, Any], Any],
    params: Any,
    batch: Mapping[str, Any],
    **trace_options: Any,
) -> ModelSpec:
    """`client.trace(loss_fn, params, batch, **trace_options)` with shape-polymorphic layer
    programs (batch dim 0 of every batch input symbolic). Raises `NotBatchPolymorphic`."""
    k0 = _batch_size(batch)
    k1 = 2 * k0
    with recording_exports() as calls0:
        spec = trace(loss_fn, params, batch, **trace_options)
    with recording_exports() as calls1:
        probe = trace(loss_fn, params, _resized(batch, k1), **trace_options)
    if len(calls0) != len(calls1) or len(spec.layers) != len(probe.layers):
        raise NotBatchPolymorphic(
            f"the model traces into different layers at batch {k0} and {k1}; trace it at "
            "each micro-batch size instead"
        )
    (b,) = jax.export.symbolic_shape(SYMBOL)
    programs: dict[str, LayerPrograms] = {}
    for c0, c1 in zip(calls0, calls1, strict=True):
        programs[c0.programs.forward] = _export_symbolic(c0, c1, BatchPoints(k0, k1, b))
    layers = []
    for layer in spec.layers:
        update: dict[str, Any] = _programs_update(layer.name, layer.forward, programs)
        variants = {
            n: v.model_copy(update=_programs_update(layer.name, v.forward, programs))
            for n, v in layer.remat_variants.items()
        }
        if variants:
            update["remat_variants"] = variants
        layers.append(layer.model_copy(update=update))
    facts = SymbolicBatch(
        symbol=SYMBOL,
        probe_size=k1,
        probe_flops=[
            LayerBatchFlops(
                forward=p.flops,
                backward=p.backward_flops,
                variants={n: v.backward_flops for n, v in p.remat_variants.items()},
            )
            for p in probe.layers
        ],
    )
    return spec.model_copy(update={"layers": layers, "symbolic_batch": facts})


def build_zoo_symbolic(
    name: str, remat_variants: tuple[str, ...] = ("full", "dots"), **overrides: Any
) -> ModelSpec:
    """Zoo model `name` (as `client.zoo.build`) with a symbolic batch dimension."""
    from client import zoo

    built = zoo.make(name, **overrides)
    return trace_symbolic_batch(
        built.loss_fn,
        built.params,
        built.batch,
        name=name,
        logical_axes=built.logical_axes,
        remat_variants=remat_variants,
    )


def _programs_update(name: str, forward: str, programs: Mapping[str, LayerPrograms]) -> dict:
    if forward not in programs:
        raise NotBatchPolymorphic(f"layer {name!r}: its programs were not exported by the trace")
    pair = programs[forward]
    return {"forward": pair.forward, "backward": pair.backward}


def _batch_size(batch: Mapping[str, Any]) -> int:
    sizes = {np.shape(v)[0] if np.shape(v) else None for v in batch.values()}
    if len(sizes) != 1 or None in sizes:
        raise NotBatchPolymorphic(
            f"every batch input needs the same batch size in dim 0, got {sorted(map(str, sizes))}"
        )
    (size,) = sizes
    assert size is not None
    return int(size)


def _resized(batch: Mapping[str, Any], size: int) -> dict[str, jax.ShapeDtypeStruct]:
    return {
        k: jax.ShapeDtypeStruct((size, *np.shape(v)[1:]), np.asarray(v).dtype)
        if not isinstance(v, jax.ShapeDtypeStruct)
        else jax.ShapeDtypeStruct((size, *v.shape[1:]), v.dtype)
        for k, v in batch.items()
    }


def _export_symbolic(c0: ExportCall, c1: ExportCall, pts: BatchPoints) -> LayerPrograms:
    """The layer of `c0` exported with a symbolic batch (its twin at the other size: `c1`)."""
    shapes = {}
    for v0, v1 in zip(
        [*c0.params, *c0.inputs, *c0.outputs], [*c1.params, *c1.inputs, *c1.outputs], strict=True
    ):
        if v0.name != v1.name:
            raise NotBatchPolymorphic(f"var {v0.name!r} is {v1.name!r} at the other batch size")
        shapes[v0.name] = pts.shape(v0.shape, v1.shape, f"var {v0.name!r}")
    for p in c0.params:
        if shapes[p.name] != tuple(p.shape):
            raise NotBatchPolymorphic(f"parameter {p.name!r} changes shape with the batch size")
    fn = Generalized(c0.closed, c1.closed, pts)
    pair = export_layer_pair(
        lambda *args: tuple(fn(*args)),
        c0.params,
        c0.inputs,
        c0.outputs,
        c0.no_grad,
        remat=c0.remat,
        shapes=shapes,
    )
    if pair.saved != c0.programs.saved:
        raise NotBatchPolymorphic(
            f"layer {c0.outputs[0].name!r}: its backward reads other vars with a symbolic batch"
        )
    return pair
