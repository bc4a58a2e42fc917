"""Export one layer as a pair of `jax.export` programs: forward-with-residuals and backward.

forward  `(*params, *inputs) -> (*outputs, *residuals)`
backward `(*params, *saved, *residuals, *cotangents) -> (*param_grads, *input_cotangents)`

`jax.vjp` runs inside the exported forward, so the residuals are exactly what a training
step keeps (what a `jax.checkpoint` policy saves, when the model has one) and the backward
never re-runs the forward. `saved` are the layer's own inputs and outputs the backward reads
(kept once, by name, however many layers read them); cotangents come for the floating outputs,
in order, and input cotangents go to the floating inputs that are not batch inputs.
"""

import base64
import hashlib
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.extend import core

from schemas import DTYPE_BYTES, FLOAT_DTYPES, ParamSpec, VarSpec

log = logging.getLogger(__name__)

# Lower for both so a spec traced on a laptop runs on CPU and GPU workers alike.
PLATFORMS: tuple[str, ...] = ("cpu", "cuda")


def slice_jaxpr(
    eqns: Sequence[core.JaxprEqn],
    constvars: Sequence[core.Var],
    consts: Sequence[object],
    invars: Sequence[core.Var],
    outvars: Sequence[core.Var],
) -> core.ClosedJaxpr:
    """A closed jaxpr of `eqns` taking `invars` and returning `outvars`."""
    effects: set[object] = set()
    for eqn in eqns:
        effects |= set(eqn.effects)
    debug = core.DebugInfo(
        "stageprof layer",
        "layer",
        tuple(f"arg{i}" for i in range(len(invars))),
        tuple(f"result{i}" for i in range(len(outvars))),
    )
    jaxpr = core.Jaxpr(
        constvars, invars, outvars, eqns, effects=frozenset(effects), debug_info=debug
    )
    return core.ClosedJaxpr(jaxpr, list(consts))


def layer_text(closed: core.ClosedJaxpr) -> str:
    """The layer's jaxpr as retraced text (vars named by appearance) plus a digest of consts."""
    fn = core.jaxpr_as_fun(closed)
    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
    text = str(jax.make_jaxpr(fn)(*avals))
    if closed.consts:
        digest = hashlib.sha256()
        for c in closed.consts:
            arr = np.asarray(c)
            digest.update(f"{arr.dtype}{arr.shape}".encode())
            digest.update(arr.tobytes())
        text += f"\n# consts sha256 {digest.hexdigest()}"
    return text


@dataclass(frozen=True)
class LayerPrograms:
    """A layer's exported pair (base64) and the signature facts the spec records."""

    forward: str
    backward: str
    residuals: list[VarSpec]
    saved: list[tuple[str, int]]  # ("input" | "output", position) of each saved var
    grad_inputs: list[int]  # positions of the differentiated inputs

    def names(
        self, inputs: Sequence[VarSpec], outputs: Sequence[VarSpec]
    ) -> tuple[list[str], list[str]]:
        """`saved` and `grad_inputs` as the var names of a layer with these inputs/outputs
        (identical layers share one export but not their var names)."""
        saved = [(inputs if kind == "input" else outputs)[i].name for kind, i in self.saved]
        return saved, [inputs[j].name for j in self.grad_inputs]


@dataclass
class _VJPLayout:
    """Where each leaf of the forward's VJP comes from: ("param" | "input" | "output" |
    "residual", index). Set while tracing the forward, read while tracing the backward."""

    tree: Any = None
    leaves: list[tuple[str, int]] | None = None


def _struct(v: VarSpec) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(v.shape), np.dtype(v.dtype))


def _b64(exported: jax.export.Exported) -> str:
    return base64.b64encode(exported.serialize()).decode("ascii")


def export_layer_pair(
    fn: Callable[..., Sequence[jax.Array]],
    params: Sequence[ParamSpec],
    inputs: Sequence[VarSpec],
    outputs: Sequence[VarSpec],
    no_grad: Collection[str] = (),
    platforms: Sequence[str] = PLATFORMS,
) -> LayerPrograms:
    """Export `fn(*params, *inputs) -> tuple(outputs)` as forward-with-residuals + backward.

    `no_grad`: input names whose cotangents nobody needs (the model's batch inputs);
    integer inputs are never differentiated either."""
    n_p = len(params)
    diff_in = [j for j, v in enumerate(inputs) if v.dtype in FLOAT_DTYPES and v.name not in no_grad]
    float_out = [k for k, v in enumerate(outputs) if v.dtype in FLOAT_DTYPES]
    other_out = [k for k, v in enumerate(outputs) if v.dtype not in FLOAT_DTYPES]
    layout = _VJPLayout()

    def forward(*args: jax.Array) -> tuple[jax.Array, ...]:
        ps, xs = list(args[:n_p]), list(args[n_p:])

        def f(pp: list, dd: list) -> tuple[tuple, tuple]:
            full = list(xs)
            for j, d in zip(diff_in, dd, strict=True):
                full[j] = d
            outs = fn(*pp, *full)
            return tuple(outs[k] for k in float_out), tuple(outs[k] for k in other_out)

        fouts, vjp, others = jax.vjp(f, ps, [xs[j] for j in diff_in], has_aux=True)
        outs: list[Any] = [None] * len(outputs)
        for k, o in zip(float_out + other_out, list(fouts) + list(others), strict=True):
            outs[k] = o
        known: dict[int, tuple[str, int]] = {}
        for k, o in enumerate(outs):
            known.setdefault(id(o), ("output", k))
        for j, x in enumerate(xs):
            known[id(x)] = ("input", j)
        for i, p in enumerate(ps):
            known[id(p)] = ("param", i)
        leaves, layout.tree = jax.tree_util.tree_flatten(vjp)
        residuals: list[Any] = []
        fresh: dict[int, int] = {}
        layout.leaves = []
        for leaf in leaves:
            where = known.get(id(leaf))
            if where is None:
                if id(leaf) not in fresh:
                    fresh[id(leaf)] = len(residuals)
                    residuals.append(leaf)
                where = ("residual", fresh[id(leaf)])
            layout.leaves.append(where)
        return (*outs, *residuals)

    in_structs = [_struct(v) for v in [*params, *inputs]]
    fwd = jax.export.export(jax.jit(forward), platforms=platforms)(*in_structs)
    assert layout.leaves is not None
    res_avals = fwd.out_avals[len(outputs) :]
    residual_specs = []
    for k, aval in enumerate(res_avals):
        dtype = np.dtype(aval.dtype).name
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"residual {k} of type {aval.str_short()} cannot be stashed")
        residual_specs.append(VarSpec(name=f"res{k}", shape=tuple(aval.shape), dtype=dtype))
    saved_refs = sorted({w for w in layout.leaves if w[0] in ("input", "output")})
    saved_vars = [inputs[i] if kind == "input" else outputs[i] for kind, i in saved_refs]
    slot = {ref: n for n, ref in enumerate(saved_refs)}
    leaf_layout = list(layout.leaves)
    tree = layout.tree
    n_s, n_r = len(saved_refs), len(residual_specs)

    def backward(*args: jax.Array) -> tuple[jax.Array, ...]:
        ps, saved = args[:n_p], args[n_p : n_p + n_s]
        res, cts = args[n_p + n_s : n_p + n_s + n_r], args[n_p + n_s + n_r :]
        leaves = []
        for kind, i in leaf_layout:
            if kind == "param":
                leaves.append(ps[i])
            elif kind == "residual":
                leaves.append(res[i])
            else:
                leaves.append(saved[slot[(kind, i)]])
        grads_p, grads_d = jax.tree_util.tree_unflatten(tree, leaves)(tuple(cts))
        return (*grads_p, *grads_d)

    bwd_structs = [
        *in_structs[:n_p],
        *(_struct(v) for v in saved_vars),
        *(_struct(v) for v in residual_specs),
        *(_struct(outputs[k]) for k in float_out),
    ]
    bwd = jax.export.export(jax.jit(backward), platforms=platforms)(*bwd_structs)
    return LayerPrograms(
        forward=_b64(fwd),
        backward=_b64(bwd),
        residuals=residual_specs,
        saved=list(saved_refs),
        grad_inputs=diff_in,
    )


def export_layer(
    closed: core.ClosedJaxpr,
    params: Sequence[ParamSpec],
    inputs: Sequence[VarSpec],
    outputs: Sequence[VarSpec],
    no_grad: Collection[str] = (),
) -> LayerPrograms:
    """Export a layer's jaxpr slice (invars = params then inputs) as its program pair."""
    fn = core.jaxpr_as_fun(closed)
    return export_layer_pair(lambda *args: tuple(fn(*args)), params, inputs, outputs, no_grad)
