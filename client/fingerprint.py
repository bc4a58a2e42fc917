"""The tracer's cache key for exports: layers whose canonical jaxpr and vars are equal are
exported once and share their programs. Not a fingerprint: the fingerprint measurements are
keyed by is computed from the exported programs (`programs.layer_fingerprint`)."""

import hashlib
import json
import re

from schemas import VarSpec

# Object addresses (e.g. in the repr of a custom_jvp rule) and source locations.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_LOCATION = re.compile(r"\s*#?\s*\[?[^\s\[\]]+\.py:\d+(:\d+)?\]?|\s*loc\(.*?\)$", re.MULTILINE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SPACES = re.compile(r"[ \t]+")
_VAR = re.compile(r"\b[a-z]+\b(?=:)")


def canonical_jaxpr(text: str) -> str:
    """Jaxpr text without colour codes, addresses and locations, vars renamed by first
    appearance."""
    text = _ANSI.sub("", text)
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


def export_key(
    jaxpr: str,
    params: list,
    inputs: list[VarSpec],
    outputs: list[VarSpec],
    grad_inputs: list[str],
) -> str:
    """sha256 of the canonical jaxpr, every var's shape, dtype and logical axes, and which
    inputs are differentiated (by position)."""
    grads = set(grad_inputs)
    payload = json.dumps(
        {
            "jaxpr": canonical_jaxpr(jaxpr),
            "params": _vars(params),
            "inputs": _vars(inputs),
            "outputs": _vars(outputs),
            "grad_inputs": [j for j, v in enumerate(inputs) if v.name in grads],
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()
