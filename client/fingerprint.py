"""Layer fingerprints: a hash of the canonical computation and its shapes, never of names.

Pure functions over a layer's jaxpr text and declared vars, so anyone holding a `LayerSpec`
(the server included) computes the same fingerprint without jax.
"""

import hashlib
import json
import re

from schemas import LayerSpec, VarSpec

# Object addresses (e.g. in the repr of a custom_jvp rule) and source locations.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_LOCATION = re.compile(r"\s*#?\s*\[?[^\s\[\]]+\.py:\d+(:\d+)?\]?|\s*loc\(.*?\)$", re.MULTILINE)
_SPACES = re.compile(r"[ \t]+")
_VAR = re.compile(r"\b[a-z]+\b(?=:)")


def canonical_jaxpr(text: str) -> str:
    """Jaxpr text with addresses and locations stripped and vars renamed by first appearance."""
    text = _ADDRESS.sub("", text)
    text = _LOCATION.sub("", text)
    lines = [_SPACES.sub(" ", line).strip() for line in text.splitlines()]
    text = "\n".join(line for line in lines if line)
    names: dict[str, str] = {}

    def rename(match: re.Match[str]) -> str:
        return names.setdefault(match.group(0), f"v{len(names)}")

    # Rename every token that is ever bound as `name:type`, wherever it occurs.
    bound = set(_VAR.findall(text))
    return re.sub(r"\b[a-z]+\b", lambda m: rename(m) if m.group(0) in bound else m.group(0), text)


def _vars(vs: list[VarSpec]) -> list[list[object]]:
    return [[list(v.shape), v.dtype, list(getattr(v, "logical_axes", None) or [])] for v in vs]


# The layer form: 2 = forward-with-residuals + backward. Layers of another form never share
# a fingerprint (or a stored measurement) with these.
LAYER_FORM = 2


def fingerprint(
    jaxpr: str,
    params: list,
    inputs: list[VarSpec],
    outputs: list[VarSpec],
    grad_inputs: list[str] | None = None,
    residuals: list[VarSpec] | None = None,
) -> str:
    """sha256 of the canonical jaxpr plus the shapes, dtypes and logical axes of every var,
    which inputs are differentiated (by position) and the residuals' shapes and dtypes."""
    grads = set(grad_inputs or [])
    payload = json.dumps(
        {
            "form": LAYER_FORM,
            "jaxpr": canonical_jaxpr(jaxpr),
            "params": _vars(params),
            "inputs": _vars(inputs),
            "outputs": _vars(outputs),
            "grad_inputs": [j for j, v in enumerate(inputs) if v.name in grads],
            "residuals": _vars(residuals or []),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def layer_fingerprint(layer: LayerSpec) -> str:
    """The fingerprint of a `LayerSpec` (its `jaxpr` text, declared vars and residuals)."""
    return fingerprint(
        layer.jaxpr,
        list(layer.params),
        list(layer.inputs),
        list(layer.outputs),
        list(layer.grad_inputs),
        list(layer.residuals),
    )
