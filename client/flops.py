"""FLOP estimates for jaxpr equations (forward, per call), recursing into nested jaxprs."""

import math
from collections.abc import Iterable
from typing import Any

from jax.extend import core

# Primitives that move or reinterpret data without arithmetic.
_FREE = frozenset(
    {
        "broadcast_in_dim",
        "reshape",
        "transpose",
        "squeeze",
        "expand_dims",
        "convert_element_type",
        "slice",
        "dynamic_slice",
        "dynamic_update_slice",
        "gather",
        "concatenate",
        "pad",
        "iota",
        "copy",
        "copy_p",
        "select_n",
        "stop_gradient",
        "rev",
        "device_put",
        "sharding_constraint",
        "split",
    }
)


def _size(aval: Any) -> int:
    shape = getattr(aval, "shape", ())
    return math.prod(shape) if shape else 1


def _sub_jaxprs(params: dict[str, Any]) -> Iterable[tuple[core.Jaxpr, int]]:
    """Nested jaxprs of an equation's params, with how many times each runs."""
    length = int(params.get("length", 1)) if "length" in params else 1
    for value in params.values():
        items = value if isinstance(value, list | tuple) else (value,)
        for item in items:
            if isinstance(item, core.ClosedJaxpr):
                yield item.jaxpr, length
            elif isinstance(item, core.Jaxpr):
                yield item, length


def eqn_flops(eqn: Any) -> float:
    """Forward FLOPs of one equation: 2·M·N·K for dots and convs, one per output element else."""
    name = eqn.primitive.name
    if name == "dot_general":
        (contract_lhs, _), _ = eqn.params["dimension_numbers"]
        lhs_shape = eqn.invars[0].aval.shape
        k = math.prod(lhs_shape[d] for d in contract_lhs) if contract_lhs else 1
        return 2.0 * _size(eqn.outvars[0].aval) * k
    if name == "conv_general_dilated":
        rhs = eqn.invars[1].aval.shape
        dn = eqn.params["dimension_numbers"]
        out_feature_dim = dn.rhs_spec[0]
        per_output = math.prod(rhs) // rhs[out_feature_dim]
        return 2.0 * _size(eqn.outvars[0].aval) * per_output
    subs = list(_sub_jaxprs(eqn.params))
    if subs:
        # cond: count the most expensive branch; everything else: the sum of its bodies.
        costs = [jaxpr_flops(j) * n for j, n in subs]
        return float(max(costs) if name == "cond" else sum(costs))
    if name in _FREE:
        return 0.0
    return float(sum(_size(v.aval) for v in eqn.outvars))


def jaxpr_flops(jaxpr: core.Jaxpr) -> float:
    """Forward FLOPs of a whole jaxpr."""
    return float(sum(eqn_flops(e) for e in jaxpr.eqns))
