"""Scans over stacked parameters become stacks of layers.

A `scan` whose scanned-over inputs (`xs`) are model parameters (directly, or after the
`transpose` / `reshape` / `convert_element_type` that `nn.scan` with `variable_axes` other than
0 inserts) is replaced by its `length` iterations, each the scan body's equations under a scope
`<label>/<i>` (the label: the stacked parameters' common module, e.g. `layers`). Iteration `i`
reads its own slices of the stacked parameters, new parameters named `<stacked name>[i]`; the
carry is the activation passed from one iteration to the next. Identical iterations give
identical layer jaxprs, so the tracer exports their programs once.

Scans are found inside `jit` calls (inlined) and `jax.checkpoint` / `nn.remat` (each iteration
is then checkpointed with the same policy). A scan that reads no parameter through its `xs` (a
loop over time inside a layer) is left alone.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
from jax.extend import core

from client.layers import live_eqns

_CALLS = ("jit", "pjit", "closed_call", "core_call")
_REMAT = ("remat2", "checkpoint")
_CUSTOM = ("custom_vjp_call", "custom_vjp_call_jaxpr", "custom_jvp_call")
# Ops that keep a stacked parameter's layer axis whole: the iteration applies them to its slice.
_VIEWS = ("transpose", "reshape", "convert_element_type", "copy", "copy_p")


@dataclass(frozen=True)
class Slice:
    """A parameter that is one iteration's slice of a stacked parameter."""

    var: Any
    stacked: Any  # the stacked parameter's top-level var
    name: str  # e.g. "params/decoder/layers/Dense_0/kernel[3]"
    axis: int  # the layer axis of the stacked parameter
    index: int  # which slice


@dataclass(frozen=True)
class _Origin:
    """A var that is a parameter seen through views (primitive, params, input aval); at a
    scan, `axis` is the parameter's axis that the scan's axis 0 runs over."""

    param: Any
    views: tuple[tuple[Any, dict[str, Any], Any], ...] = ()
    axis: int = 0


@dataclass
class Unstacked:
    """The top-level equations with scans over parameters unrolled into layers."""

    eqns: list[Any]
    outvars: list[Any]
    slices: list[Slice] = field(default_factory=list)
    constvars: list[Any] = field(default_factory=list)  # consts the scan bodies closed over
    consts: list[Any] = field(default_factory=list)
    # id(eqn) -> (scan, position in the body) for the equations of an iteration
    tags: dict[int, tuple[int, int]] = field(default_factory=dict)

    def template(self, eqns: Sequence[Any], invars: Sequence[Any], outvars: Sequence[Any]) -> Any:
        """A key equal for slices of iterations of one scan that are the same computation
        (same body positions, same wiring), or None when `eqns` are not all iterations'."""
        tags = tuple(self.tags.get(id(e)) for e in eqns)
        if not tags or None in tags:
            return None
        number: dict[Any, int] = {}

        def num(a: Any) -> Any:
            return number.setdefault(a, len(number)) if isinstance(a, core.Var) else None

        wiring = [num(v) for v in invars]
        for e in eqns:
            wiring += [num(v) for v in e.invars] + [num(v) for v in e.outvars]
        wiring += [num(v) for v in outvars]
        return tags, tuple(wiring)


def unstack_scans(eqns: Sequence[Any], outvars: Sequence[Any], params: dict[Any, str]) -> Unstacked:
    """Unroll every scan over stacked parameters in `eqns` (see the module doc).

    `params`: the top-level parameter vars and their names. Raises `ValueError` naming the
    scan for what cannot be unrolled: per-iteration outputs used later, `xs` that are not
    parameters, a scan inside a custom derivative, a stacked parameter also used elsewhere."""
    state = _Unroller(params, outvars)
    state.run(list(eqns), None)
    out = [state.sub(v) for v in outvars]
    eqns = live_eqns(state.out, out)
    used = {v for e in eqns for v in e.invars if isinstance(v, core.Var)} | set(out)
    for s in state.slices:
        if s.stacked in used:
            raise ValueError(
                f"parameter {params[s.stacked]!r} is scanned over as a stack of layers and "
                "also used outside the scan; a stacked parameter must only feed its scan"
            )
    tags = {id(e): state.tags[id(e)] for e in eqns if id(e) in state.tags}
    return Unstacked(eqns, out, state.slices, state.constvars, state.consts, tags)


class _Unroller:
    def __init__(self, params: dict[Any, str], outvars: Sequence[Any]) -> None:
        self.params = params
        self.origin: dict[Any, _Origin] = {v: _Origin(v) for v in params}
        self.subst: dict[Any, Any] = {}
        self.out: list[Any] = []
        self.slices: list[Slice] = []
        self.constvars: list[Any] = []
        self.consts: list[Any] = []
        self.scans = 0
        self.tags: dict[int, tuple[int, int]] = {}
        self.final = set(outvars)

    def sub(self, atom: Any) -> Any:
        return self.subst.get(atom, atom) if isinstance(atom, core.Var) else atom

    def run(self, eqns: list[Any], remat: dict[str, Any] | None) -> None:
        uses = _later_uses(eqns) | self.final
        for eqn in eqns:
            eqn = eqn.replace(invars=[self.sub(v) for v in eqn.invars])
            name = eqn.primitive.name
            if name in _VIEWS and eqn.invars and self._is_param(eqn.invars[0]):
                self._view(eqn)
                self.out.append(eqn)
            elif name == "scan" and self._stacked_xs(eqn):
                self._unroll(eqn, remat, uses)
            elif (name in _CALLS or name in _REMAT) and self._holds_scan(eqn):
                body = _body(eqn)
                inner = _renamed(body, eqn.invars, eqn.source_info.name_stack, self)
                nested = remat
                if name in _REMAT:
                    nested = {k: v for k, v in eqn.params.items() if k != "jaxpr"}
                self.final |= set(inner.outvars)
                self.run(inner.eqns, nested)
                for outer, v in zip(eqn.outvars, inner.outvars, strict=True):
                    self.subst[outer] = self.sub(v)
            elif name in _CUSTOM and self._holds_scan(eqn):
                raise ValueError(
                    f"a scan over stacked parameters runs inside a {name} at "
                    f"{_where(eqn)}; its custom derivative covers the whole scan, so the "
                    "iterations cannot be layers (move the custom rule into the scan body)"
                )
            else:
                self.out.append(eqn)

    def _is_param(self, v: Any) -> bool:
        return isinstance(v, core.Var) and v in self.origin

    def _view(self, eqn: Any) -> None:
        src = self.origin[eqn.invars[0]]
        views = (*src.views, (eqn.primitive, dict(eqn.params), eqn.invars[0].aval))
        self.origin[eqn.outvars[0]] = _Origin(src.param, views)

    def _stacked_xs(self, eqn: Any) -> list[_Origin | None] | None:
        xs = eqn.invars[eqn.params["num_consts"] + eqn.params["num_carry"] :]
        found = [self._layer_origin(v) for v in xs]
        return found if any(found) else None

    def _layer_origin(self, v: Any) -> _Origin | None:
        """The origin of a scanned-over var whose axis 0 is a stacked parameter's layer axis."""
        o = self.origin.get(v) if isinstance(v, core.Var) else None
        if o is None:
            return None
        axis = _axis_back(o.views, 0)
        return None if axis is None else _Origin(o.param, o.views, axis)

    def _holds_scan(self, eqn: Any) -> bool:
        mask = [self._is_param(v) for v in eqn.invars]
        return any(mask) and _scans_params(_body(eqn), mask)

    def _unroll(self, eqn: Any, remat: dict[str, Any] | None, uses: set[Any]) -> None:
        p = eqn.params
        self.scans += 1
        n_c, n_k, length = p["num_consts"], p["num_carry"], int(p["length"])
        consts, carry = eqn.invars[:n_c], eqn.invars[n_c : n_c + n_k]
        xs, origins = eqn.invars[n_c + n_k :], self._stacked_xs(eqn) or []
        label = _label([self.params[o.param] for o in origins if o is not None])
        where = f"the scan of length {length} over {label} at {_where(eqn)}"
        for v, o in zip(xs, origins, strict=True):
            if o is None:
                raise ValueError(
                    f"{where} also scans over {v.aval.str_short()}, which is not a parameter: "
                    "only stacked parameters can be scanned over when the iterations are "
                    "layers (pass it through the carry, or index it by a carried counter)"
                )
        ys = [v for v in eqn.outvars[n_k:] if v in uses]
        if ys:
            raise ValueError(
                f"{where} returns per-iteration outputs (ys) that are used after it: "
                "unsupported when the iterations are layers; return only the carry"
            )
        body: core.ClosedJaxpr = p["jaxpr"]
        if remat is not None and body.consts:
            raise ValueError(f"{where} closes over constants inside jax.checkpoint: unsupported")
        bconsts = self._body_consts(body)
        views = [self._views_jaxpr(o) for o in origins]
        stack = eqn.source_info.name_stack.extend(label)
        for k in range(length):
            i = length - 1 - k if p["reverse"] else k
            info = eqn.source_info.replace(name_stack=stack.extend(str(i)))
            first = len(self.out)
            sliced = [self._slice(o, v, i, info) for o, v in zip(origins, views, strict=True)]
            args = [*consts, *carry, *sliced]
            if remat is None:
                inner = _renamed(body.jaxpr, [*bconsts, *args], info.name_stack, self)
                self.out.extend(inner.eqns)
                results = list(inner.outvars)
            else:
                results = [core.Var(v.aval) for v in body.jaxpr.outvars]
                self.out.append(
                    core.new_jaxpr_eqn(
                        args,
                        results,
                        _remat_p(),
                        {**remat, "jaxpr": body.jaxpr},
                        body.jaxpr.effects,
                        info,
                    )
                )
            carry = results[:n_k]
            for j, e in enumerate(self.out[first:]):
                self.tags[id(e)] = (self.scans, j)
        for outer, v in zip(eqn.outvars[:n_k], carry, strict=True):
            self.subst[outer] = v

    def _body_consts(self, body: core.ClosedJaxpr) -> list[Any]:
        fresh = []
        for v, c in zip(body.jaxpr.constvars, body.consts, strict=True):
            var = core.Var(v.aval)
            self.constvars.append(var)
            self.consts.append(c)
            fresh.append(var)
        return fresh

    def _views_jaxpr(self, o: _Origin | None) -> Any:
        """The views applied to one slice (the layer axis taken out), as a jaxpr, or None."""
        assert o is not None
        if not o.views:
            return None
        shape = slice_shape(o.param.aval.shape, o.axis)
        struct = jax.ShapeDtypeStruct(shape, o.param.aval.dtype)
        return jax.make_jaxpr(_views_fn(o.views, o.axis))(struct).jaxpr

    def _slice(self, o: _Origin | None, views: Any, i: int, info: Any) -> Any:
        assert o is not None
        stacked = o.param
        var = core.Var(stacked.aval.update(shape=slice_shape(stacked.aval.shape, o.axis)))
        self.slices.append(Slice(var, stacked, f"{self.params[stacked]}[{i}]", o.axis, i))
        if views is None:
            return var
        inner = _renamed(views, [var], info.name_stack, self)
        self.out.extend(inner.eqns)
        return inner.outvars[0]


@dataclass
class _Inlined:
    eqns: list[Any]
    outvars: list[Any]


def _renamed(jaxpr: Any, args: Sequence[Any], prefix: Any, state: _Unroller) -> _Inlined:
    """`jaxpr`'s equations on `args` (constvars first when it has any), with fresh outvars and
    `prefix` before their name stacks."""
    env: dict[Any, Any] = dict(zip([*jaxpr.constvars, *jaxpr.invars], args, strict=True))

    def sub(a: Any) -> Any:
        return env.get(a, a) if isinstance(a, core.Var) else a

    eqns = []
    for eqn in jaxpr.eqns:
        fresh = [v if isinstance(v, core.DropVar) else core.Var(v.aval) for v in eqn.outvars]
        info = eqn.source_info
        eqns.append(
            eqn.replace(
                invars=[sub(v) for v in eqn.invars],
                outvars=fresh,
                source_info=info.replace(name_stack=prefix + info.name_stack),
            )
        )
        env.update(zip(eqn.outvars, fresh, strict=True))
    return _Inlined(eqns, [sub(v) for v in jaxpr.outvars])


def _views_fn(views: Sequence[tuple[Any, dict[str, Any], Any]], axis: int) -> Any:
    def fn(x: jax.Array) -> jax.Array:
        a = axis
        for prim, params, aval in views:
            if prim.name == "transpose":
                perm = list(params["permutation"])
                b = perm.index(a)
                params = {**params, "permutation": tuple(q - (q > a) for q in perm if q != a)}
            elif prim.name == "reshape":
                sizes = list(params["new_sizes"])
                moved = _reshaped_axis(aval.shape, sizes, a, params)
                assert moved is not None
                b = moved
                del sizes[b]
                params = {**params, "new_sizes": tuple(sizes)}
            else:
                b = a
            a = b
            if _no_op(prim.name, params, x):  # e.g. the transpose that moved the layer axis
                continue
            x = prim.bind(x, **params)
        return x

    return fn


def _no_op(name: str, params: dict[str, Any], x: Any) -> bool:
    if name == "transpose":
        return tuple(params["permutation"]) == tuple(range(len(params["permutation"])))
    if name == "reshape":
        return tuple(params["new_sizes"]) == tuple(x.shape)
    if name == "convert_element_type":
        return params["new_dtype"] == x.dtype
    return False


def _reshaped_axis(
    shape: Sequence[int], new: Sequence[int], a: int, params: dict[str, Any]
) -> int | None:
    """Where axis `a` of `shape` lands in a reshape to `new` that keeps it whole, or None."""
    if a < 0 or params.get("dimensions") is not None:
        return None
    before = math.prod(shape[:a])
    for b in range(len(new)):
        if math.prod(new[:b]) == before and new[b] == shape[a]:
            return b
    return None


def _axis_back(views: Sequence[tuple[Any, dict[str, Any], Any]], axis: int) -> int | None:
    """The parameter's axis that ends up as `axis` after `views`, or None."""
    a: int | None = axis
    for prim, params, aval in reversed(views):
        if a is None:
            return None
        if prim.name == "transpose":
            a = list(params["permutation"])[a]
        elif prim.name == "reshape":
            new = params["new_sizes"]
            shape = aval.shape
            a = next(
                (
                    c
                    for c in range(len(shape))
                    if _reshaped_axis(shape, new, c, params) == a and shape[c] == new[a]
                ),
                None,
            )
    return a


def _label(names: Sequence[str]) -> str:
    """The stacked parameters' common module: the last name their directories share."""
    dirs = [n.split("/")[:-1] for n in names]
    common: list[str] = []
    for parts in zip(*dirs, strict=False):
        if any(p != parts[0] for p in parts):
            break
        common.append(parts[0])
    skip = {"params", "value"}
    for part in reversed(common):
        if part not in skip:
            return part
    return "scan"


def _where(eqn: Any) -> str:
    return str(eqn.source_info.name_stack) or "the top level"


def _body(eqn: Any) -> Any:
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        body = eqn.params.get(key)
        if isinstance(body, core.ClosedJaxpr):
            return body.jaxpr
        if isinstance(body, core.Jaxpr):
            return body
    return None


def _scans_params(jaxpr: Any, mask: Sequence[bool]) -> bool:
    """Whether `jaxpr` (its invars where `mask` is set being parameters) holds, at any depth of
    calls, a scan whose xs are parameters seen through views."""
    if jaxpr is None or len(mask) != len(jaxpr.invars):
        return False
    params = {v for v, m in zip(jaxpr.invars, mask, strict=True) if m}
    for eqn in jaxpr.eqns:
        ins = [isinstance(v, core.Var) and v in params for v in eqn.invars]
        name = eqn.primitive.name
        if name in _VIEWS and ins and ins[0]:
            params.add(eqn.outvars[0])
        elif name == "scan":
            if any(ins[eqn.params["num_consts"] + eqn.params["num_carry"] :]):
                return True
        elif any(ins) and _scans_params(_body(eqn), ins):
            return True
    return False


def _later_uses(eqns: Sequence[Any]) -> set[Any]:
    return {v for e in eqns for v in e.invars if isinstance(v, core.Var)}


def _remat_p() -> Any:
    from jax._src.ad_checkpoint import remat_p

    return remat_p


def slice_shape(shape: Sequence[int], axis: int) -> tuple[int, ...]:
    """A stacked parameter's shape without its layer axis."""
    return tuple(int(d) for k, d in enumerate(shape) if k != axis)
