"""Layer markers and cutting a jaxpr's equations into layers by their top-level named scope."""

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
from jax.extend import core

from client.scopes import Level, level_segments, scope_paths

# What an equation reads: a variable or a literal.
Atom = core.Var | core.Literal

_INVALID = re.compile(r"[^A-Za-z0-9_.:/\-\[\]]")


@contextlib.contextmanager
def layer(name: str) -> Iterator[None]:
    """Mark the enclosed computation as one layer (a thin wrapper on `jax.named_scope`)."""
    with jax.named_scope(name):
        yield


def clean_name(name: str, fallback: str) -> str:
    """`name` made valid for schemas' NAME_PATTERN (invalid characters become '_')."""
    name = _INVALID.sub("_", name)[:128]
    if not name:
        return fallback
    if not (name[0].isalpha() or name[0] == "_"):
        name = ("_" + name)[:128]
    return name


def top_scope(eqn: core.JaxprEqn) -> str | None:
    """The outermost `jax.named_scope` name of an equation, or None when it has none."""
    for item in eqn.source_info.name_stack.stack:
        name = getattr(item, "name", None)
        if type(item).__name__ == "Scope" and name:
            return str(name)
    return None


def scope_segments(eqns: Sequence[core.JaxprEqn]) -> list[tuple[str, int, int]]:
    """Cut equations into contiguous `(name, lo, hi)` runs of equal top-level scope.

    Unscoped equations join the run before them (or the first run when they lead). A scope
    name that comes back after another scope starts a new layer named `name.1`, `name.2`, …
    (`client.scopes` cuts at deeper levels too.)
    """
    return level_segments(scope_paths(eqns), Level(1))


def _has_scopes(jaxpr: core.Jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        if top_scope(eqn) is not None:
            return True
        inner = eqn.params.get("jaxpr") if eqn.primitive.name in _CALLS else None
        if inner is not None and _has_scopes(inner.jaxpr):
            return True
    return False


_CALLS = ("jit", "pjit")


def inline_scoped_calls(
    eqns: Sequence[core.JaxprEqn],
    outvars: Sequence[Atom],
    big: Callable[[core.JaxprEqn], bool] | None = None,
) -> tuple[list[core.JaxprEqn], list[Atom]]:
    """Inline unscoped `jit` calls whose bodies hold layer scopes, or that are `big` (most of
    the model: a jitted loss or model function), so their layers can be cut; other calls
    stay whole. Returns (eqns, outvars)."""
    subst: dict[core.Var, Atom] = {}
    out: list[core.JaxprEqn] = []

    def sub(env: Mapping[core.Var, Atom], atom: Atom) -> Atom:
        return env.get(atom, atom) if isinstance(atom, core.Var) else atom

    for eqn in eqns:
        invars = [sub(subst, v) for v in eqn.invars]
        inner = eqn.params.get("jaxpr") if eqn.primitive.name in _CALLS else None
        if inner is None or inner.consts or top_scope(eqn):
            out.append(eqn.replace(invars=invars))
            continue
        if not (_has_scopes(inner.jaxpr) or (big is not None and big(eqn))):
            out.append(eqn.replace(invars=invars))
            continue
        body, body_out = inline_scoped_calls(inner.jaxpr.eqns, inner.jaxpr.outvars, big)
        local = dict(zip(inner.jaxpr.invars, invars, strict=True))
        prefix = eqn.source_info.name_stack
        for inner_eqn in body:
            fresh = [
                v if isinstance(v, core.DropVar) else core.Var(v.aval) for v in inner_eqn.outvars
            ]
            info = inner_eqn.source_info
            out.append(
                inner_eqn.replace(
                    invars=[sub(local, v) for v in inner_eqn.invars],
                    outvars=fresh,
                    source_info=info.replace(name_stack=prefix + info.name_stack),
                )
            )
            local.update(zip(inner_eqn.outvars, fresh, strict=True))
        for outer, inner_out in zip(eqn.outvars, body_out, strict=True):
            subst[outer] = sub(local, inner_out)
    return out, [sub(subst, v) for v in outvars]


def live_eqns(eqns: Sequence[Any], outvars: Sequence[Any]) -> list[Any]:
    """`eqns` without those whose results never reach `outvars` (and have no effects)."""
    needed = {v for v in outvars if isinstance(v, core.Var)}
    kept = []
    for eqn in reversed(eqns):
        if eqn.effects or any(v in needed for v in eqn.outvars):
            kept.append(eqn)
            needed.update(v for v in eqn.invars if isinstance(v, core.Var))
    return kept[::-1]


def localize(pieces: Sequence[Sequence[Any]], can_cross: Callable[[Any], bool]) -> list[list[Any]]:
    """Each layer's equations (`pieces`, in order), with a copy of the zero-FLOP chain that
    makes a var no layer boundary can pass (a PRNG key wrapped from its key data) from the
    parameters, constants and inputs alone, in each later layer that reads it."""
    made: dict[Any, Any] = {}  # var -> its producing equation
    owner: dict[Any, int] = {}  # var -> the piece that makes it
    out: list[list[Any]] = []
    for s, piece in enumerate(pieces):
        local: dict[Any, Any] = {}  # original var -> this piece's copy
        extra: list[Any] = []
        body = []
        for eqn in piece:
            ins = list(eqn.invars)
            for k, v in enumerate(ins):
                if isinstance(v, core.Var) and owner.get(v, s) != s and not can_cross(v):
                    if remakeable(v, made, can_cross):
                        ins[k] = _copy(v, made, local, extra, can_cross)
            body.append(eqn.replace(invars=ins) if ins != list(eqn.invars) else eqn)
            for v in eqn.outvars:
                made[v] = eqn
                owner[v] = s
        out.append(extra + body)
    return out


def _copy(
    v: Any,
    made: Mapping[Any, Any],
    local: dict[Any, Any],
    extra: list[Any],
    can_cross: Callable[[Any], bool],
) -> Any:
    """`v` made again in this layer: its chain of equations appended to `extra`, with fresh
    vars recorded in `local`."""
    if v in local:
        return local[v]
    eqn = made[v]
    ins = [
        _copy(a, made, local, extra, can_cross)
        if isinstance(a, core.Var) and not can_cross(a) and a in made
        else a
        for a in eqn.invars
    ]
    fresh = [core.Var(o.aval) for o in eqn.outvars]
    extra.append(eqn.replace(invars=ins, outvars=fresh))
    local.update(zip(eqn.outvars, fresh, strict=True))
    return local[v]


def remakeable(v: Any, made: Mapping[Any, Any], can_cross: Callable[[Any], bool]) -> bool:
    """Whether `v`, of an extended dtype (a PRNG key), is made by a short chain of equations
    (no effects) from vars that can cross layer boundaries (parameters, inputs, constants,
    activations), so a layer that reads it can make it again."""
    if not jax.dtypes.issubdtype(v.aval.dtype, jax.dtypes.extended):
        return False  # e.g. complex: what cannot cross cannot be stashed either
    todo, seen = [v], 0
    while todo:
        seen += 1
        eqn = made.get(todo.pop())
        if eqn is None or seen > 8 or eqn.effects:
            return False
        todo.extend(a for a in eqn.invars if isinstance(a, core.Var) and not can_cross(a))
    return True
