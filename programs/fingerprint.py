"""Layer fingerprints computed from the programs themselves, in a canonical form.

A fingerprint hashes the forward's and the backward's StableHLO printed without debug info
(no locations, so no file, function or scope names), with the module's own symbols renamed
by order of definition; SSA values are numbered by the printer in op order. Beside the two
modules it hashes what the programs cannot say: the parameters' logical axes, which inputs
and outputs the backward reads (by position) and which inputs are differentiated. Names of
vars, layers and scopes never enter it, so identical transformer blocks hash the same, and the
hash is equal across terminals and pipes, processes, hash seeds and machines with one jax.
"""

import hashlib
import json
import re
from collections import OrderedDict
from typing import Any

import jax
import numpy as np
from jax._src.interpreters import mlir as jax_mlir
from jaxlib.mlir import ir

from programs.load import load_program
from schemas import LayerSpec, ModelSpec, VarSpec

# Bump when what is hashed changes: fingerprints of another version never match these.
FINGERPRINT_VERSION = 3

_MODULE_NAME = re.compile(r"^module @[\w.$-]+", re.MULTILINE)
_DEFINED = re.compile(r"func\.func (?:public |private |nested )?@([\w.$-]+)\(")
_CACHE_SIZE = 4096
_by_programs: OrderedDict[str, str] = OrderedDict()
_by_program: OrderedDict[str, dict[str, Any]] = OrderedDict()


def canonical_module(exported: jax.export.Exported) -> str:
    """The exported StableHLO module as canonical text: no debug info, the module unnamed,
    its functions other than `main` renamed `@f0, @f1, ...` by order of definition."""
    with jax_mlir.make_ir_context():
        module = ir.Module.parse(exported.mlir_module())
        text = str(module.operation.get_asm(enable_debug_info=False))
    text = _MODULE_NAME.sub("module", text, count=1)
    renames: dict[str, str] = {}
    for name in _DEFINED.findall(text):
        if name != "main" and name not in renames:
            renames[name] = f"f{len(renames)}"
    if renames:
        pattern = re.compile(r"@(" + "|".join(re.escape(n) for n in renames) + r")\b")
        text = pattern.sub(lambda m: "@" + renames[m.group(1)], text)
    return text


def _program_facts(text: str) -> dict[str, Any]:
    """The canonical module's hash and what the module leaves to the `Exported` wrapper,
    cached by the program's text (identical layers share their program bytes)."""
    key = hashlib.sha256(text.encode("ascii", errors="replace")).hexdigest()
    facts = _by_program.get(key)
    if facts is None:
        facts = _facts(load_program(text))
        _by_program[key] = facts
        if len(_by_program) > _CACHE_SIZE:
            _by_program.popitem(last=False)
    else:
        _by_program.move_to_end(key)
    return facts


def _facts(exported: jax.export.Exported) -> dict[str, Any]:
    return {
        "module_sha256": hashlib.sha256(canonical_module(exported).encode()).hexdigest(),
        "in_avals": [_aval(a) for a in exported.in_avals],
        "out_avals": [_aval(a) for a in exported.out_avals],
        "kept_var_idx": sorted(exported.module_kept_var_idx),
        "platforms": list(exported.platforms),
        "nr_devices": exported.nr_devices,
        "in_shardings": [str(s) for s in exported.in_shardings_hlo],
        "out_shardings": [str(s) for s in exported.out_shardings_hlo],
        "calling_convention": exported.calling_convention_version,
    }


def _aval(aval: Any) -> list[Any]:
    return [list(aval.shape), np.dtype(aval.dtype).name]


def _vars(vs: list[VarSpec]) -> list[list[Any]]:
    return [[list(v.shape), v.dtype] for v in vs]


def layer_fingerprint(layer: LayerSpec) -> str:
    """sha256 (hex) of a layer's canonical forward and backward programs and the facts about
    them that only its spec records. Raises what `load_program` raises for a bad program."""
    key = hashlib.sha256(
        json.dumps(
            [layer.forward, layer.backward, layer.model_dump(exclude=_NOT_HASHED)],
            sort_keys=True,
        ).encode()
    ).hexdigest()
    cached = _by_programs.get(key)
    if cached is not None:
        _by_programs.move_to_end(key)
        return cached
    inputs = [v.name for v in layer.inputs]
    outputs = [v.name for v in layer.outputs]
    saved = [
        ["input", inputs.index(n)] if n in inputs else ["output", outputs.index(n)]
        for n in layer.saved
    ]
    payload = {
        "version": FINGERPRINT_VERSION,
        "forward": _program_facts(layer.forward),
        "backward": _program_facts(layer.backward),
        "params": [[list(p.shape), p.dtype, list(p.logical_axes or [])] for p in layer.params],
        "inputs": _vars(list(layer.inputs)),
        "outputs": _vars(list(layer.outputs)),
        "residuals": _vars(list(layer.residuals)),
        "saved": saved,
        "grad_inputs": [inputs.index(n) for n in layer.grad_inputs],
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
    _by_programs[key] = digest
    if len(_by_programs) > _CACHE_SIZE:
        _by_programs.popitem(last=False)
    return digest


# Spec fields that never enter a fingerprint (names, text for people, the claimed hash).
_NOT_HASHED = {"name", "jaxpr", "flops", "fingerprint", "forward", "backward"}


def with_fingerprints(spec: ModelSpec) -> ModelSpec:
    """`spec` with every layer's fingerprint set to the one its programs give."""
    layers = [
        layer.model_copy(update={"fingerprint": layer_fingerprint(layer)}) for layer in spec.layers
    ]
    return spec.model_copy(update={"layers": layers})


def verified(spec: ModelSpec) -> ModelSpec:
    """`spec` whose programs load and match their declared vars, with fingerprints computed
    from them. Raises `ValueError` naming every layer whose programs are wrong or whose
    stated fingerprint is not its programs' own."""
    from programs.check import check_programs

    problems = [str(p) for p in check_programs(spec)]
    if not problems:
        for i, layer in enumerate(spec.layers):
            computed = layer_fingerprint(layer)
            if layer.fingerprint and layer.fingerprint != computed:
                problems.append(
                    f"layers[{i}].fingerprint: is {layer.fingerprint!r} but the layer's "
                    f"programs give {computed!r}"
                )
    if problems:
        raise ValueError("; ".join(problems))
    return with_fingerprints(spec)
