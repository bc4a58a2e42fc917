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
import contextlib
import contextvars
import functools
import hashlib
import logging
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core

from client.batch_affine import inlined
from client.flops import eqn_flops
from programs import strip_locations
from schemas import DTYPE_BYTES, FLOAT_DTYPES, ParamSpec, VarSpec

log = logging.getLogger(__name__)

# Rematerialization variants: what each policy lets the forward save for the backward.
REMAT_POLICIES: dict[str, Callable[..., bool]] = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}

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
    effects: set[core.Effect] = set()
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
    # Never coloured: jax colours jaxprs printed for a terminal.
    text = jax.make_jaxpr(fn)(*avals).pretty_print(use_color=False)
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
    backward_flops: float = 0.0  # the backward's FLOPs, recomputation included

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
    "residual", index), and every residual's shape and dtype. Set while tracing the forward,
    read while tracing the backward."""

    tree: Any = None
    leaves: list[tuple[str, int]] | None = None
    residuals: list[jax.ShapeDtypeStruct] | None = None


# A shape whose dims may be symbolic (`jax.export.symbolic_shape`), by var name.
Shapes = Mapping[str, tuple[Any, ...]]


def _struct(v: VarSpec, shapes: Shapes | None = None) -> jax.ShapeDtypeStruct:
    shape = tuple(v.shape) if shapes is None or v.name not in shapes else shapes[v.name]
    return jax.ShapeDtypeStruct(shape, np.dtype(v.dtype))


@dataclass(frozen=True)
class ExportCall:
    """One `export_layer` call as a tracer made it: the layer's jaxpr slice, its vars and
    what it gave (see `recording_exports`)."""

    closed: core.ClosedJaxpr
    params: list[ParamSpec]
    inputs: list[VarSpec]
    outputs: list[VarSpec]
    no_grad: frozenset[str]
    remat: str
    programs: LayerPrograms


_RECORDING: contextvars.ContextVar[list[ExportCall] | None] = contextvars.ContextVar(
    "stageprof_export_recording", default=None
)


@contextlib.contextmanager
def recording_exports() -> Iterator[list[ExportCall]]:
    """Record every `export_layer` call made inside the block, in order (a second trace at
    another batch size pairs its calls with the first's: `client.symbolic_batch`)."""
    calls: list[ExportCall] = []
    token = _RECORDING.set(calls)
    try:
        yield calls
    finally:
        _RECORDING.reset(token)


def _b64(exported: jax.export.Exported) -> str:
    """The serialized program, base64, without the source locations of this machine."""
    return base64.b64encode(strip_locations(exported.serialize())).decode("ascii")


def export_layer_pair(
    fn: Callable[..., Sequence[jax.Array]],
    params: Sequence[ParamSpec],
    inputs: Sequence[VarSpec],
    outputs: Sequence[VarSpec],
    no_grad: Collection[str] = (),
    platforms: Sequence[str] = PLATFORMS,
    remat: str = "as_written",
    shapes: Shapes | None = None,
) -> LayerPrograms:
    """Export `fn(*params, *inputs) -> tuple(outputs)` as forward-with-residuals + backward.

    `remat`: "as_written" exports `fn` as it is; a name of `REMAT_POLICIES` exports it under
    `jax.checkpoint` with that policy (the backward recomputes what the policy does not save).

    `no_grad`: input names whose cotangents nobody needs (the model's batch inputs);
    integer inputs are never differentiated either. Residuals and saved vars the backward
    never reads (e.g. what a custom JVP rule linearizes but its transpose drops) are left
    out of both programs, so the stash is what a compiled training step keeps.

    `shapes`: symbolic shapes of inputs and outputs by name (a batch dimension from
    `jax.export.symbolic_shape`); the programs are then shape-polymorphic, and the residuals
    and backward FLOPs, which depend on the size, are left empty (the caller knows them at a
    concrete size)."""
    if remat != "as_written":
        if remat not in REMAT_POLICIES:
            raise ValueError(f"remat: unknown variant {remat!r}; use one of {list(REMAT_POLICIES)}")
        fn = jax.checkpoint(fn, policy=REMAT_POLICIES[remat])
    pair = _LayerPair(fn, params, inputs, outputs, no_grad, platforms, shapes)
    fwd, bwd = pair.export(None, None)
    kept = set(bwd.module_kept_var_idx)
    n_p, saved, res = len(params), pair.saved_refs, list(range(len(pair.residual_structs)))
    pair.recompute = pair.input_free_residuals()
    keep_saved = [ref for k, ref in enumerate(saved) if n_p + k in kept]
    keep_res = [r for r in res if n_p + len(saved) + r in kept and r not in pair.recompute]
    if len(keep_saved) < len(saved) or len(keep_res) < len(res):
        fwd, bwd = pair.export(keep_saved, keep_res)
    else:
        keep_saved, keep_res = saved, res
    if shapes is not None:
        return LayerPrograms(_b64(fwd), _b64(bwd), [], list(keep_saved), pair.diff_in)
    residual_specs = []
    for k, r in enumerate(keep_res):
        aval = pair.residual_structs[r]
        dtype = np.dtype(aval.dtype).name
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"residual {r} of type {aval.dtype}{aval.shape} cannot be stashed")
        residual_specs.append(VarSpec(name=f"res{k}", shape=tuple(aval.shape), dtype=dtype))
    return LayerPrograms(
        forward=_b64(fwd),
        backward=_b64(bwd),
        residuals=residual_specs,
        saved=list(keep_saved),
        grad_inputs=pair.diff_in,
        backward_flops=pair.backward_flops(keep_saved, keep_res),
    )


class _LayerPair:
    """Traces a layer's forward (with `jax.vjp` inside) and backward for `export`."""

    def __init__(
        self,
        fn: Callable[..., Sequence[jax.Array]],
        params: Sequence[ParamSpec],
        inputs: Sequence[VarSpec],
        outputs: Sequence[VarSpec],
        no_grad: Collection[str],
        platforms: Sequence[str],
        shapes: Shapes | None = None,
    ) -> None:
        self.fn, self.platforms, self.shapes = fn, platforms, shapes
        # Residuals computed from constants and the batch size as a value (the count a mean
        # divides by): the backward recomputes them, as it reads a literal at a fixed size.
        self.recompute: dict[int, Callable[[], jax.Array]] = {}
        self.params, self.inputs, self.outputs = list(params), list(inputs), list(outputs)
        self.diff_in = [
            j for j, v in enumerate(inputs) if v.dtype in FLOAT_DTYPES and v.name not in no_grad
        ]
        self.float_out = [k for k, v in enumerate(outputs) if v.dtype in FLOAT_DTYPES]
        self.other_out = [k for k, v in enumerate(outputs) if v.dtype not in FLOAT_DTYPES]
        self.layout = _VJPLayout()

    @property
    def saved_refs(self) -> list[tuple[str, int]]:
        """The layer's inputs/outputs the VJP keeps, as ("input" | "output", position)."""
        assert self.layout.leaves is not None
        return sorted({w for w in self.layout.leaves if w[0] in ("input", "output")})

    def _var(self, ref: tuple[str, int]) -> VarSpec:
        """The layer input or output a saved ref ("input" | "output", position) names."""
        kind, i = ref
        return (self.inputs if kind == "input" else self.outputs)[i]

    @property
    def residual_structs(self) -> list[jax.ShapeDtypeStruct]:
        assert self.layout.residuals is not None
        return self.layout.residuals

    def _forward(self, keep_res: Sequence[int] | None, *args: jax.Array) -> tuple:
        n_p, layout = len(self.params), self.layout
        ps, xs = list(args[:n_p]), list(args[n_p:])

        def f(pp: list, dd: list) -> tuple[tuple, tuple]:
            full = list(xs)
            for j, d in zip(self.diff_in, dd, strict=True):
                full[j] = d
            outs = self.fn(*pp, *full)
            return tuple(outs[k] for k in self.float_out), tuple(outs[k] for k in self.other_out)

        fouts, vjp, others = jax.vjp(f, ps, [xs[j] for j in self.diff_in], has_aux=True)
        outs: list[Any] = [None] * len(self.outputs)
        for k, o in zip(self.float_out + self.other_out, [*fouts, *others], strict=True):
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
        layout.residuals = [jax.ShapeDtypeStruct(r.shape, r.dtype) for r in residuals]
        kept = range(len(residuals)) if keep_res is None else keep_res
        return (*outs, *(residuals[r] for r in kept))

    def _backward(
        self,
        saved_refs: Sequence[tuple[str, int]],
        keep_res: Sequence[int],
        *args: jax.Array,
    ) -> tuple[jax.Array, ...]:
        n_p, n_s, n_r = len(self.params), len(saved_refs), len(keep_res)
        ps, saved = args[:n_p], dict(zip(saved_refs, args[n_p : n_p + n_s], strict=True))
        res = dict(zip(keep_res, args[n_p + n_s : n_p + n_s + n_r], strict=True))
        cts = args[n_p + n_s + n_r :]
        assert self.layout.leaves is not None
        leaves = []
        for kind, i in self.layout.leaves:
            if kind == "param":
                leaves.append(ps[i])
            elif kind == "residual" and i in self.recompute:
                leaves.append(self.recompute[i]())
            elif kind == "residual":  # a residual backward never reads: a stand-in
                r = self.residual_structs[i]
                leaves.append(res[i] if i in res else jnp.zeros(r.shape, r.dtype))
            else:
                var = self._struct(self._var((kind, i)))
                leaves.append(saved.get((kind, i), jnp.zeros(var.shape, var.dtype)))
        grads_p, grads_d = jax.tree_util.tree_unflatten(self.layout.tree, leaves)(tuple(cts))
        return (*grads_p, *grads_d)

    def _struct(self, v: VarSpec) -> jax.ShapeDtypeStruct:
        return _struct(v, self.shapes)

    def input_free_residuals(self) -> dict[int, Callable[[], jax.Array]]:
        """Residuals the forward computes from no argument but the batch size as a value,
        each as a function that computes it again."""
        in_structs = [self._struct(v) for v in [*self.params, *self.inputs]]
        closed = jax.make_jaxpr(functools.partial(self._forward, None))(*in_structs)
        jaxpr, n_out = closed.jaxpr, len(self.outputs)
        depends = set(jaxpr.invars)
        for eqn in jaxpr.eqns:
            if any(isinstance(v, core.Var) and v in depends for v in eqn.invars):
                depends.update(eqn.outvars)
        free = [e for e in jaxpr.eqns if not any(v in depends for v in e.outvars)]
        found: dict[int, Callable[[], jax.Array]] = {}
        for r, var in enumerate(jaxpr.outvars[n_out:]):
            if isinstance(var, core.Var) and var not in depends:
                eqns = live_eqns_of(free, [var])
                if eqns:
                    piece = slice_jaxpr(eqns, jaxpr.constvars, closed.consts, [], [var])
                    found[r] = functools.partial(_first_result, core.jaxpr_as_fun(piece))
        return found

    def _backward_structs(
        self, saved: Sequence[tuple[str, int]], res: Sequence[int]
    ) -> list[jax.ShapeDtypeStruct]:
        return [
            *(self._struct(v) for v in self.params),
            *(self._struct(self._var(ref)) for ref in saved),
            *(self.residual_structs[r] for r in res),
            *(self._struct(self.outputs[k]) for k in self.float_out),
        ]

    def backward_flops(self, saved: Sequence[tuple[str, int]], res: Sequence[int]) -> float:
        """FLOPs of the backward keeping these saved vars and residuals (live equations only)."""
        fn = functools.partial(self._backward, list(saved), list(res))
        closed = jax.make_jaxpr(fn)(*self._backward_structs(saved, res))
        return live_flops(closed.jaxpr)

    def export(
        self,
        keep_saved: Sequence[tuple[str, int]] | None,
        keep_res: Sequence[int] | None,
    ) -> tuple[jax.export.Exported, jax.export.Exported]:
        """Export forward and backward, keeping the given saved vars and residuals (all of
        them when None)."""
        in_structs = [self._struct(v) for v in [*self.params, *self.inputs]]
        fwd = jax.export.export(
            jax.jit(functools.partial(self._forward, keep_res)), platforms=self.platforms
        )(*in_structs)
        saved = self.saved_refs if keep_saved is None else list(keep_saved)
        res = list(range(len(self.residual_structs))) if keep_res is None else list(keep_res)
        bwd = jax.export.export(
            jax.jit(functools.partial(self._backward, saved, res)), platforms=self.platforms
        )(*self._backward_structs(saved, res))
        return fwd, bwd


def live_eqns_of(eqns: Sequence[core.JaxprEqn], outvars: Sequence[Any]) -> list[core.JaxprEqn]:
    """The equations of `eqns` that `outvars` need, in order."""
    needed = {v for v in outvars if isinstance(v, core.Var)}
    kept = []
    for eqn in reversed(eqns):
        if any(v in needed for v in eqn.outvars):
            kept.append(eqn)
            needed.update(v for v in eqn.invars if isinstance(v, core.Var))
    return kept[::-1]


def _reads_batch_size(eqn: core.JaxprEqn) -> bool:
    """Whether an equation reads the batch size as a value (a mean's divisor), where a trace
    at a concrete size has a literal."""
    return eqn.primitive.name == "dim_as_value"


def _first_result(fn: Callable[[], Sequence[jax.Array]]) -> jax.Array:
    return fn()[0]


def export_layer(
    closed: core.ClosedJaxpr,
    params: Sequence[ParamSpec],
    inputs: Sequence[VarSpec],
    outputs: Sequence[VarSpec],
    no_grad: Collection[str] = (),
    remat: str = "as_written",
) -> LayerPrograms:
    """Export a layer's jaxpr slice (invars = params then inputs) as its program pair, under
    remat variant `remat`."""
    fn = inlined(closed)
    pair = export_layer_pair(
        lambda *args: tuple(fn(*args)), params, inputs, outputs, no_grad, remat=remat
    )
    calls = _RECORDING.get()
    if calls is not None:
        call = ExportCall(
            closed, list(params), list(inputs), list(outputs), frozenset(no_grad), remat, pair
        )
        calls.append(call)
    return pair


def live_flops(jaxpr: core.Jaxpr) -> float:
    """FLOPs of the equations of `jaxpr` whose results reach its outputs (or have effects)."""
    needed = {v for v in jaxpr.outvars if isinstance(v, core.Var)}
    total = 0.0
    for eqn in reversed(jaxpr.eqns):
        if eqn.effects or any(v in needed for v in eqn.outvars):
            total += eqn_flops(eqn)
            needed.update(v for v in eqn.invars if isinstance(v, core.Var))
    return total


def stash_bytes(
    programs: LayerPrograms, inputs: Sequence[VarSpec], outputs: Sequence[VarSpec]
) -> int:
    """Bytes a pair keeps per micro-batch for its backward: residuals and saved vars."""
    saved = sum((inputs if k == "input" else outputs)[i].size_bytes for k, i in programs.saved)
    return saved + sum(r.size_bytes for r in programs.residuals)
