"""Export one layer's jaxpr slice as a `jax.export` program (base64) with its jaxpr text."""

import base64
import hashlib
import logging
from collections.abc import Sequence

import jax
import numpy as np
from jax.extend import core

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


def export_layer(closed: core.ClosedJaxpr) -> str:
    """Serialize (vjp_order=1) the layer as a function of its invars; base64 text."""
    fn = core.jaxpr_as_fun(closed)
    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
    exported = jax.export.export(jax.jit(lambda *args: tuple(fn(*args))), platforms=PLATFORMS)(
        *avals
    )
    return base64.b64encode(exported.serialize(vjp_order=1)).decode("ascii")
