"""Structural tokens of jaxpr equations: equal for equations that do the same computation on
the same shapes and dtypes, whatever their variables, scopes or source locations are called.

An equation's token is its primitive, its params in a canonical form (a nested jaxpr by its
own equations' tokens and wiring) and its input and output avals. Tokens are small ints,
numbered in order of first appearance, so sequences of them compare with numpy.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np
from jax.extend import core


class Tokenizer:
    """Numbers equations by structure (see the module doc); one per traced function."""

    def __init__(self) -> None:
        self._ids: dict[Any, int] = {}
        self._jaxprs: dict[int, tuple[Any, Any]] = {}  # id(jaxpr) -> (jaxpr, its key)

    def tokens(
        self, eqns: Sequence[Any], weak: Sequence[bool] | np.ndarray | None = None
    ) -> np.ndarray:
        """One token per equation; where `weak` is set, by primitive and avals only (params
        left out: e.g. `head_mask[i]`, a slice at a different index in every block)."""
        marks = weak if weak is not None else [False] * len(eqns)
        return np.fromiter(
            (self.weak_token(e) if w else self.token(e) for e, w in zip(eqns, marks, strict=True)),
            dtype=np.int64,
            count=len(eqns),
        )

    def token(self, eqn: Any) -> int:
        key = self._key(eqn)
        return self._ids.setdefault(key, len(self._ids))

    def weak_token(self, eqn: Any) -> int:
        ins = tuple(_aval(v.aval) for v in eqn.invars)
        key = ("weak", eqn.primitive.name, ins, tuple(_aval(v.aval) for v in eqn.outvars))
        return self._ids.setdefault(key, len(self._ids))

    def _key(self, eqn: Any) -> tuple:
        params = tuple(sorted((k, self._canon(v)) for k, v in eqn.params.items()))
        ins = tuple(_atom(v) for v in eqn.invars)
        outs = tuple(_aval(v.aval) for v in eqn.outvars)
        return (eqn.primitive.name, params, ins, outs)

    def _canon(self, value: Any) -> Any:
        if isinstance(value, core.ClosedJaxpr):
            return ("closed", self._jaxpr_key(value.jaxpr), len(value.consts))
        if isinstance(value, core.Jaxpr):
            return ("jaxpr", self._jaxpr_key(value))
        if isinstance(value, tuple | list):
            return tuple(self._canon(v) for v in value)
        if isinstance(value, dict):
            return tuple(sorted((str(k), self._canon(v)) for k, v in value.items()))
        if isinstance(value, np.ndarray):
            return ("array", value.shape, str(value.dtype), value.tobytes())
        if (callable(value) or hasattr(value, "call_wrapped")) and not isinstance(value, type):
            # A thunk or rule made per call (custom_jvp's jvp, custom_vjp's fwd/bwd): its code.
            inner = getattr(value, "f", value)
            return ("fn", getattr(inner, "__module__", ""), getattr(inner, "__qualname__", ""))
        try:
            hash(value)
        except TypeError:
            return ("repr", type(value).__name__, repr(value))
        return value

    def _jaxpr_key(self, jaxpr: Any) -> Any:
        """A nested jaxpr's key: its equations' tokens and wiring (variables numbered by first
        appearance), its in/out avals. Cached by identity (a jaxpr object is immutable)."""
        hit = self._jaxprs.get(id(jaxpr))
        if hit is not None and hit[0] is jaxpr:
            return hit[1]
        number: dict[Any, int] = {}

        def num(a: Any) -> Any:
            if isinstance(a, core.Literal):
                return _atom(a)
            return number.setdefault(a, len(number))

        for v in [*jaxpr.constvars, *jaxpr.invars]:
            num(v)
        body = tuple(
            (self.token(e), tuple(num(v) for v in e.invars), tuple(num(v) for v in e.outvars))
            for e in jaxpr.eqns
        )
        key = (
            tuple(_aval(v.aval) for v in [*jaxpr.constvars, *jaxpr.invars]),
            body,
            tuple(num(v) for v in jaxpr.outvars),
        )
        self._jaxprs[id(jaxpr)] = (jaxpr, key)
        return key


def _aval(aval: Any) -> tuple:
    return (tuple(getattr(aval, "shape", ())), str(getattr(aval, "dtype", type(aval).__name__)))


def _atom(v: Any) -> tuple:
    if isinstance(v, core.Literal):
        val = v.val
        if isinstance(val, np.ndarray):
            val = (val.shape, val.tobytes())
        return ("lit", _aval(v.aval), str(val) if not _hashable(val) else val)
    return _aval(v.aval)


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
