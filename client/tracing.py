"""Trace a JAX loss into a `ModelSpec`: layers by named scope or by clustering, exported."""

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.extend import core

from client.clustering import cluster_segments, cut_bytes
from client.export import (
    REMAT_POLICIES,
    LayerPrograms,
    export_layer,
    layer_text,
    slice_jaxpr,
    stash_bytes,
)
from client.fingerprint import export_key
from client.flax_scopes import module_scopes
from client.flops import eqn_flops, jaxpr_flops
from client.layers import clean_name, inline_scoped_calls, live_eqns, localize
from client.scan import Unstacked, unstack_scans
from client.scopes import choose_level, inside_scopes, level_segments, scope_paths
from client.state import check_params
from client.structure import group_layers, segment_names, structural_layers
from programs import layer_fingerprint
from schemas import (
    DTYPE_BYTES,
    FLOAT_DTYPES,
    LayerSpec,
    ModelSpec,
    ParamSpec,
    RematVariant,
    VarSpec,
)

log = logging.getLogger(__name__)

LogicalAxes = Mapping[str, tuple[str | None, ...] | None]


def path_name(path: tuple[Any, ...]) -> str:
    """A pytree key path as 'a/b/3/c'."""
    parts = []
    for key in path:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return clean_name("/".join(parts), "param")


def _dtype_name(aval: Any) -> str:
    """The aval's dtype name (an extended dtype, e.g. a PRNG key's, by its own name)."""
    try:
        return np.dtype(aval.dtype).name
    except TypeError:
        return str(aval.dtype)


@dataclass
class _Var:
    """Where a top-level jaxpr var comes from and what it is called in the spec."""

    kind: str  # "param", "input", "const" or "act"
    name: str = ""
    index: int = 0  # param index, const index, or producing segment
    sub: int = 0  # a stacked parameter's slice: which one
    uses: set[int] = field(default_factory=set)  # segments that read it


def _spec(v: Any, name: str) -> VarSpec:
    return VarSpec(name=name, shape=tuple(v.aval.shape), dtype=_dtype_name(v.aval))


def trace(
    loss_fn: Callable[[Any, Any], Any],
    params: Any,
    batch: Mapping[str, Any],
    layers: int | None = None,
    name: str = "model",
    logical_axes: LogicalAxes | None = None,
    scopes: str | int | None = None,
    remat_variants: tuple[str, ...] = ("full", "dots"),
) -> ModelSpec:
    """Trace `loss_fn(params, batch) -> scalar` into a `ModelSpec`.

    `params` is a pytree of arrays or `jax.ShapeDtypeStruct`s (names come from its key paths);
    `batch` a dict of named arrays at the micro-batch size. `logical_axes` maps parameter
    names to axis names.

    Layers come from named scopes (`client.layer`, `jax.named_scope`, Flax module calls, which
    open scopes while tracing whatever the user's Flax settings). `scopes` picks them:
    - None (default): a model with repeated child modules (a Flax model's blocks `h_0, h_1..`,
      `layers_0..`, NNX `layers/0..`: sibling scopes whose names differ in a trailing index)
      gets one layer per block, at the level whose blocks hold the most FLOPs, and one layer
      per stretch between them (embedding; final norm, head and loss). Otherwise each
      top-level scope is a layer.
    - a glob pattern, e.g. `"h_*"` or `"transformer/h_*"` (`*` stays within one scope name;
      it may match the end of a scope path): the matching scopes are the layers.
    - an int: every scope that many levels down is a layer (`1`: each top-level scope).
    A scan over stacked parameters (`jax.lax.scan`, `nn.scan`, `nnx.scan`) is a stack of
    layers: iteration `i` runs under the scope `<module>/<i>` (e.g. `layers/3`) and reads its
    slices of the stacked parameters, named `<name>[i]` (see `client.scan`).

    With `layers=N` the equations are clustered into N layers by FLOPs; when the chosen level
    is below the top (a model of modules), cuts fall only between its scopes.

    `remat_variants`: each distinct layer is also exported under these rematerialization
    policies (`"full"`: the backward recomputes the whole layer; `"dots"`: matmul outputs
    without batch dims are saved), for the planner to choose per stage; a variant that keeps
    no less than the layer as written is left out. `()` exports the layers as written only.
    """
    unknown_remat = sorted(set(remat_variants) - set(REMAT_POLICIES))
    if unknown_remat:
        raise ValueError(
            f"remat_variants: unknown {unknown_remat}; use names of {list(REMAT_POLICIES)}"
        )
    if not isinstance(batch, Mapping) or not batch:
        raise ValueError("batch must be a non-empty dict of named arrays")
    leaves_with_paths, _ = jax.tree_util.tree_flatten_with_path(params)
    param_names = [path_name(p) for p, _ in leaves_with_paths]
    batch_names = sorted(batch)
    for key in batch_names:
        if clean_name(str(key), "") != key:
            raise ValueError(f"batch key {key!r} is not a valid name (letters, digits, _.:/-[])")
    seen: set[str] = set()
    for n in param_names + batch_names:
        if n in seen:
            raise ValueError(f"two params or batch inputs are both named {n!r}; rename one")
        seen.add(n)
    axes = dict(logical_axes or {})
    unknown = sorted(set(axes) - set(param_names))
    if unknown:
        raise ValueError(f"logical_axes names unknown parameters: {unknown}")

    check_params([leaf for _, leaf in leaves_with_paths], param_names)

    def fresh(p: Any, b: Mapping[str, Any]) -> Any:
        # A new function on every trace: JAX reuses a function's cached trace (one made by an
        # earlier jax.jit of it), which lacks the scopes module calls open while tracing here.
        return loss_fn(p, b)

    with module_scopes():
        closed = jax.make_jaxpr(fresh)(params, dict(batch))
    jaxpr = closed.jaxpr
    if len(jaxpr.outvars) != 1 or jaxpr.outvars[0].aval.shape != ():
        raise ValueError(f"loss_fn must return one scalar, got {jaxpr.outvars}")
    total = jaxpr_flops(jaxpr)
    all_eqns, outvars = inline_scoped_calls(
        jaxpr.eqns, jaxpr.outvars, lambda e: eqn_flops(e) >= 0.5 * total > 0
    )
    param_vars = jaxpr.invars[: len(param_names)]
    unstacked = unstack_scans(all_eqns, outvars, dict(zip(param_vars, param_names, strict=True)))
    (loss_var,) = unstacked.outvars
    eqns = live_eqns(unstacked.eqns, [loss_var])
    if not isinstance(loss_var, core.Var) or not any(loss_var in e.outvars for e in eqns):
        raise ValueError("the loss must be computed from params and batch, not a constant")

    info: dict[Any, _Var] = {}
    for i, v in enumerate(jaxpr.invars[: len(param_names)]):
        info[v] = _Var("param", param_names[i], i)
    for v, key in zip(jaxpr.invars[len(param_names) :], batch_names, strict=True):
        info[v] = _Var("input", key)
    consts = [*closed.consts, *unstacked.consts]
    for i, v in enumerate([*jaxpr.constvars, *unstacked.constvars]):
        info[v] = _Var("const", f"const{i}", i)
    index = {v: i for i, v in enumerate(param_vars)}
    for piece in unstacked.slices:
        info[piece.var] = _Var("param", piece.name, index[piece.stacked], piece.index)
        stacked_axes = axes.get(param_names[index[piece.stacked]])
        if stacked_axes is not None and len(stacked_axes) == len(piece.stacked.aval.shape):
            axes[piece.name] = tuple(a for k, a in enumerate(stacked_axes) if k != piece.axis)

    def can_cross(v: Any) -> bool:
        return _dtype_name(v.aval) in DTYPE_BYTES and all(d >= 1 for d in v.aval.shape)

    flops = [eqn_flops(e) for e in eqns]
    paths = scope_paths(eqns)
    level = choose_level(paths, flops, scopes)
    found = None
    if scopes is None:
        found = structural_layers(
            eqns,
            [loss_var],
            lambda v: v in info and info[v].kind == "param",
            flops,
            paths,
            can_cross,
        )
    if found is not None:
        eqns = [eqns[i] for i in found.order]
        flops = [flops[i] for i in found.order]
        paths = [paths[i] for i in found.order]
        names = segment_names(paths, flops, found)
        if layers is None:
            segments = [(n, lo, hi) for n, (lo, hi, _) in zip(names, found.segments, strict=True)]
        else:
            segments = group_layers(found.segments, flops, found.cut, names, int(layers))
    elif layers is None:
        segments = level_segments(paths, level)
    else:
        cuts = cut_bytes(eqns, [loss_var], can_cross)
        if level.depth > 1:
            cuts = np.where(inside_scopes(paths, level.depth), np.inf, cuts)
        segments = cluster_segments(flops, cuts, int(layers))
    seg_names = [clean_name(n, f"layer{k}") for k, (n, _, _) in enumerate(segments)]

    parts = localize([eqns[lo:hi] for _, lo, hi in segments], can_cross)
    for s, part in enumerate(parts):
        for eqn in part:
            for v in eqn.invars:
                if isinstance(v, core.Var):
                    info[v].uses.add(s)
            for v in eqn.outvars:
                if not isinstance(v, core.DropVar):
                    info[v] = _Var("act", index=s)
    info[loss_var].uses.add(len(segments))

    taken = set(param_names) | set(batch_names) | {piece.name for piece in unstacked.slices}
    layer_specs: list[LayerSpec] = []
    programs: dict[tuple[str, str], LayerPrograms | None] = {}
    texts: dict[Any, tuple[str, str]] = {}  # a scan's iterations: one retrace for all
    for s, (part, (_, lo, hi)) in enumerate(zip(parts, segments, strict=True)):
        layer_specs.append(
            _build_layer(
                s,
                seg_names[s],
                part,
                info,
                consts,
                loss_var,
                taken,
                axes,
                sum(flops[lo:hi]),
                programs,
                (unstacked, texts),
                tuple(remat_variants),
            )
        )
    inputs = [_spec(v, info[v].name) for v in jaxpr.invars[len(param_names) :]]
    return ModelSpec(
        name=clean_name(name, "model"),
        inputs=inputs,
        layers=layer_specs,
        loss=info[loss_var].name,
        jax_version=jax.__version__,
    )


def _build_layer(
    s: int,
    layer_name: str,
    eqns: list[Any],
    info: dict[Any, _Var],
    consts: list[Any],
    loss_var: Any,
    taken: set[str],
    axes: Mapping[str, tuple[str | None, ...] | None],
    flops: float,
    programs: dict[tuple[str, str], LayerPrograms | None],
    scans: tuple[Unstacked, dict[Any, tuple[str, str]]],
    variants: tuple[str, ...],
) -> LayerSpec:
    """One `LayerSpec` from a slice of equations; names its outputs and exports its program."""
    param_vars: list[Any] = []
    const_vars: list[Any] = []
    input_vars: list[Any] = []
    output_vars: list[Any] = []
    seen: set[Any] = set()
    for eqn in eqns:
        for v in eqn.invars:
            if not isinstance(v, core.Var) or v in seen:
                continue
            seen.add(v)
            kind = info[v]
            if kind.kind == "param":
                param_vars.append(v)
            elif kind.kind == "const":
                const_vars.append(v)
            elif kind.kind == "input" or kind.index != s:
                input_vars.append(v)
        for v in eqn.outvars:
            if isinstance(v, core.DropVar) or not any(u > s for u in info[v].uses):
                continue
            if v is loss_var:
                info[v].name = _fresh("loss", taken)
            else:
                info[v].name = _fresh(f"{layer_name}:{len(output_vars)}", taken)
            output_vars.append(v)
    param_vars.sort(key=lambda v: (info[v].index, info[v].sub))
    for v in input_vars + output_vars:
        if _dtype_name(v.aval) not in DTYPE_BYTES or not all(d >= 1 for d in v.aval.shape):
            raise ValueError(
                f"layer {layer_name!r}: var {info[v].name or v} of type {v.aval.str_short()} "
                f"crosses a layer boundary; only non-empty arrays of {sorted(DTYPE_BYTES)} can"
            )
    if not output_vars:
        raise ValueError(f"layer {layer_name!r} computes nothing used later; merge it")

    closed = slice_jaxpr(
        eqns,
        const_vars,
        [consts[info[v].index] for v in const_vars],
        param_vars + input_vars,
        output_vars,
    )
    params = [
        ParamSpec(
            name=info[v].name,
            shape=tuple(v.aval.shape),
            dtype=_dtype_name(v.aval),
            logical_axes=axes.get(info[v].name),
        )
        for v in param_vars
    ]
    inputs = [_spec(v, info[v].name) for v in input_vars]
    outputs = [_spec(v, info[v].name) for v in output_vars]
    batch = {info[v].name for v in input_vars if info[v].kind == "input"}
    grad_inputs = [v.name for v in inputs if v.dtype in FLOAT_DTYPES and v.name not in batch]
    unstacked, texts = scans
    template = unstacked.template(eqns, param_vars + input_vars, output_vars)
    if template is not None:  # iterations of one scan: the same text and export key
        template = (template, tuple(info[v].kind for v in input_vars), _vars_key(params))
    if template is None or template not in texts:
        text = layer_text(closed)
        key = export_key(text, params, inputs, outputs, grad_inputs)
        if template is not None:
            texts[template] = (text, key)
    else:
        text, key = texts[template]
    if (key, "as_written") not in programs:
        programs[key, "as_written"] = export_layer(closed, params, inputs, outputs, batch)
    else:
        log.debug("layer %s reuses the programs of an identical layer", layer_name)
    pair = programs[key, "as_written"]
    assert pair is not None
    saved, _ = pair.names(inputs, outputs)
    layer = LayerSpec(
        name=layer_name,
        inputs=inputs,
        outputs=outputs,
        params=params,
        forward=pair.forward,
        backward=pair.backward,
        residuals=pair.residuals,
        saved=saved,
        grad_inputs=grad_inputs,
        jaxpr=text,
        flops=flops,
        backward_flops=pair.backward_flops,
    )
    layer = layer.model_copy(update={"fingerprint": layer_fingerprint(layer)})
    remat: dict[str, RematVariant] = {}
    for variant in variants:
        if (key, variant) not in programs:
            alt = export_layer(closed, params, inputs, outputs, batch, remat=variant)
            keeps_less = stash_bytes(alt, inputs, outputs) < stash_bytes(pair, inputs, outputs)
            programs[key, variant] = alt if keeps_less else None
        alt_pair = programs[key, variant]
        if alt_pair is not None:
            remat[variant] = _variant(layer, alt_pair)
    return layer.model_copy(update={"remat_variants": remat}) if remat else layer


def _variant(layer: LayerSpec, pair: LayerPrograms) -> RematVariant:
    """`pair` as a remat variant of `layer`, with the fingerprint its programs give."""
    saved, _ = pair.names(layer.inputs, layer.outputs)
    variant = RematVariant(
        forward=pair.forward,
        backward=pair.backward,
        residuals=pair.residuals,
        saved=saved,
        backward_flops=pair.backward_flops,
    )
    view = layer.model_copy(
        update={
            "forward": pair.forward,
            "backward": pair.backward,
            "residuals": pair.residuals,
            "saved": saved,
        }
    )
    return variant.model_copy(update={"fingerprint": layer_fingerprint(view)})


def _vars_key(params: list[ParamSpec]) -> tuple:
    return tuple((p.shape, p.dtype, p.logical_axes) for p in params)


def _fresh(name: str, taken: set[str]) -> str:
    candidate, k = name, 1
    while candidate in taken:
        candidate, k = f"{name}.{k}", k + 1
    taken.add(candidate)
    return candidate
