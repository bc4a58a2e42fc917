"""Source locations out of serialized `jax.export` programs.

`jax.export` keeps the debug locations of the traced code in the StableHLO module: the file
paths, line numbers and function names of the machine that traced it, and the scope names.
None of it is needed to run, check or fingerprint a program (fingerprints already hash the
module printed without debug info), so the SDK strips it before a program leaves the
user's machine and the server strips it from uploads before storing them.
"""

import base64
import dataclasses
import functools

import jax
from jax._src.export import _export
from jax._src.interpreters import mlir as jax_mlir
from jax._src.lib import _jax
from jaxlib.mlir import passmanager

from schemas import LayerSpec, ModelSpec

_STRIP = "builtin.module(strip-debuginfo)"


def _stripped_module(serialized: bytes) -> bytes:
    """A StableHLO portable artifact re-serialized with every location `loc(unknown)`."""
    with jax_mlir.make_ir_context():
        module = _jax.mlir.deserialize_portable_artifact(serialized)
        passmanager.PassManager.parse(_STRIP).run(module.operation)
        return bytes(_export._module_to_bytecode(module))


def _stripped(exported: jax.export.Exported) -> tuple[jax.export.Exported, int]:
    """`exported` and its chain of VJPs without locations, and the length of that chain."""
    module = _stripped_module(exported.mlir_module_serialized)
    out = dataclasses.replace(exported, mlir_module_serialized=module)
    if not exported.has_vjp():
        return out, 0
    vjp, order = _stripped(exported.vjp())
    return dataclasses.replace(out, _get_vjp=lambda _exp: vjp), order + 1


def strip_locations(serialized: bytes | bytearray) -> bytes:
    """Serialized `jax.export` bytes -> the same program with no source locations (file
    paths, line numbers, function and scope names); the VJPs it carries are kept (same
    `vjp_order`) and stripped too. Raises what `jax.export.deserialize` raises for bytes
    that are not a serialized export."""
    exported, order = _stripped(jax.export.deserialize(bytearray(serialized)))
    return bytes(exported.serialize(vjp_order=order))


@functools.lru_cache(maxsize=1024)
def strip_program_text(text: str) -> str:
    """`strip_locations` of a base64 program, as base64 (cached by the text)."""
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    return base64.b64encode(strip_locations(raw)).decode("ascii")


def without_locations(spec: ModelSpec) -> ModelSpec:
    """`spec` with every layer's forward and backward stripped of source locations.
    Raises ValueError naming the layer and program that cannot be read."""
    layers: list[LayerSpec] = []
    for i, layer in enumerate(spec.layers):
        update = {}
        for field in ("forward", "backward"):
            try:
                update[field] = strip_program_text(getattr(layer, field))
            except Exception as e:  # noqa: BLE001 - whatever jax raises for bad bytes
                raise ValueError(f"layers[{i}].{field}: cannot be read: {e}") from e
        layers.append(layer.model_copy(update=update))
    return spec.model_copy(update={"layers": layers})
