"""Evaluate a layer's jaxpr again, with its `jit` calls inlined and, given its twin traced
at another batch size, every integer that differs between the two made an affine function
a·b + c of a symbolic batch size b (`client.symbolic_batch`).

Both exports (at a fixed size and with a symbolic batch) evaluate a layer this way, so they
keep the same residuals: a value computed from constants alone (a causal mask) is then seen
as such, and the backward recomputes it instead of stashing it per micro-batch.
"""

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import source_info_util
from jax.extend import core

_INLINED = ("jit", "pjit")


class NotBatchPolymorphic(ValueError):
    """The model cannot be exported with a symbolic batch dimension; the message says why."""


class BatchPoints:
    """The two traced batch sizes and the symbol: integers seen at both become a·b + c."""

    def __init__(self, k0: int, k1: int, b: Any) -> None:
        self.k0, self.k1, self.b = k0, k1, b

    def affine(self, v0: int, v1: int, what: str) -> Any:
        if v0 == v1:
            return v0
        a, rem = divmod(v1 - v0, self.k1 - self.k0)
        c = v0 - a * self.k0
        if rem or a < 0 or c < 0:  # c < 0: faster than linear (b², ...)
            raise NotBatchPolymorphic(
                f"{what} is {v0} at batch {self.k0} and {v1} at batch {self.k1}: not a·batch + c"
            )
        return a * self.b + c

    def shape(self, s0: Sequence[int], s1: Sequence[int], what: str) -> tuple[Any, ...]:
        if len(s0) != len(s1):
            raise NotBatchPolymorphic(f"{what} changes rank with the batch size")
        return tuple(self.affine(d0, d1, what) for d0, d1 in zip(s0, s1, strict=True))


class Generalized:
    """Evaluates jaxpr `j0` (traced at k0) with the params that differ from its twin `j1`
    (traced at k1) made symbolic in the batch, so it traces at a symbolic batch size."""

    def __init__(self, c0: core.ClosedJaxpr, c1: core.ClosedJaxpr, pts: BatchPoints) -> None:
        self.c0, self.c1, self.pts = c0, c1, pts
        for x0, x1 in zip(c0.consts, c1.consts, strict=True):
            if x0 is x1:
                continue
            a0, a1 = np.asarray(x0), np.asarray(x1)
            if a0.shape != a1.shape or not _same(a0, a1):
                raise NotBatchPolymorphic(
                    f"a constant of shape {a0.shape} depends on the batch size (it is "
                    f"{a1.shape} at batch {pts.k1})"
                )

    def __call__(self, *args: Any) -> list[Any]:
        return self._run(self.c0.jaxpr, self.c1.jaxpr, list(self.c0.consts), list(args))

    def _run(self, j0: core.Jaxpr, j1: core.Jaxpr, consts: list, args: list) -> list[Any]:
        if len(j0.eqns) != len(j1.eqns):
            raise NotBatchPolymorphic(
                f"{len(j0.eqns)} equations at batch {self.pts.k0}, {len(j1.eqns)} at {self.pts.k1}"
            )
        env: dict[core.Var, Any] = {}
        for v, x in zip([*j0.constvars, *j0.invars], [*consts, *args], strict=True):
            env[v] = x
        for e0, e1 in zip(j0.eqns, j1.eqns, strict=True):
            name = e0.primitive.name
            if e1.primitive is not e0.primitive:
                raise NotBatchPolymorphic(f"{name} at batch {self.pts.k0}, {e1.primitive.name}")
            ins = [
                self._read(env, a0, a1, name) for a0, a1 in zip(e0.invars, e1.invars, strict=True)
            ]
            if name in _INLINED:
                inner0, inner1 = e0.params["jaxpr"], e1.params["jaxpr"]
                outs = self._run(inner0.jaxpr, inner1.jaxpr, list(inner0.consts), ins)
                for v, x in zip(e0.outvars, outs, strict=True):
                    if not isinstance(v, core.DropVar):
                        env[v] = x
                continue
            params = {k: self._param(v, e1.params[k], f"{name}.{k}") for k, v in e0.params.items()}
            # as jax's eval_jaxpr: the equation's source and scopes, and its context
            names = source_info_util.current_name_stack() + e0.source_info.name_stack
            where_from = source_info_util.user_context(e0.source_info.traceback, name_stack=names)
            with where_from, e0.ctx.manager:
                out = e0.primitive.bind(*ins, **e0.primitive.get_bind_params(params))
            outs = out if e0.primitive.multiple_results else [out]
            for v, x in zip(e0.outvars, outs, strict=True):
                if not isinstance(v, core.DropVar):
                    env[v] = x
        return [
            self._read(env, a0, a1, "output") for a0, a1 in zip(j0.outvars, j1.outvars, strict=True)
        ]

    def _read(self, env: dict, a0: Any, a1: Any, where: str) -> Any:
        if not isinstance(a0, core.Literal):
            return env[a0]
        if a0 is a1:
            return a0.val
        v0, v1 = np.asarray(a0.val), np.asarray(a1.val)
        if _same(v0, v1):
            return a0.val
        if v0.shape or v1.shape or v0 != np.round(v0) or v1 != np.round(v1):
            raise NotBatchPolymorphic(
                f"{where}: a literal is {v0} at batch {self.pts.k0} and {v1} at {self.pts.k1} "
                "(not an integer a·batch + c)"
            )
        size = self.pts.affine(int(v0), int(v1), f"{where}: a literal")
        return jnp.asarray(size).astype(v0.dtype)

    def _param(self, p0: Any, p1: Any, where: str) -> Any:
        if p0 is p1:
            return p0
        if isinstance(p0, core.ClosedJaxpr):
            return self._closed(p0, p1)
        if isinstance(p0, core.Jaxpr):
            closed = self._closed(core.ClosedJaxpr(p0, []), core.ClosedJaxpr(p1, []))
            if closed.consts:
                raise NotBatchPolymorphic(f"{where}: a nested jaxpr gained constants")
            return closed.jaxpr
        if isinstance(p0, bool | np.bool_):
            return p0
        if isinstance(p0, int | np.integer) and isinstance(p1, int | np.integer):
            return self.pts.affine(int(p0), int(p1), where)
        if isinstance(p0, float) and isinstance(p1, float) and np.isnan(p0) and np.isnan(p1):
            return p0
        if isinstance(p0, tuple) and isinstance(p1, tuple) and len(p0) == len(p1):
            items = [self._param(x0, x1, where) for x0, x1 in zip(p0, p1, strict=True)]
            return type(p0)(*items) if hasattr(p0, "_fields") else tuple(items)
        try:
            same = bool(p0 == p1)
        except Exception:  # noqa: BLE001 - params jax cannot compare: never batch shapes
            same = p0 is p1 or type(p0) is type(p1)
        if not same:
            raise NotBatchPolymorphic(f"{where} is {p0!r} at one batch size, {p1!r} at the other")
        return p0

    def _closed(self, c0: core.ClosedJaxpr, c1: core.ClosedJaxpr) -> core.ClosedJaxpr:
        structs = [
            jax.ShapeDtypeStruct(
                self.pts.shape(v0.aval.shape, v1.aval.shape, "a nested jaxpr's input"),
                v0.aval.dtype,
            )
            for v0, v1 in zip(c0.jaxpr.invars, c1.jaxpr.invars, strict=True)
        ]
        inner = Generalized(c0, c1, self.pts)
        return jax.make_jaxpr(lambda *a: inner(*a))(*structs)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal arrays, NaN equal to NaN."""
    try:
        return bool(np.array_equal(a, b, equal_nan=True))
    except TypeError:  # a dtype without NaN
        return bool(np.array_equal(a, b))


def inlined(closed: core.ClosedJaxpr) -> Generalized:
    """`closed` as a function of its inputs, its `jit` calls inlined (one batch size)."""
    return Generalized(closed, closed, BatchPoints(1, 2, None))
