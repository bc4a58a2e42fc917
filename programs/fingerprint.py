"""Layer fingerprints computed from the programs themselves, in a canonical form.

A fingerprint hashes the forward's and the backward's StableHLO printed without debug info
(no locations, so no file, function or scope names), with the module's own symbols renamed
by order of definition; SSA values are numbered by the printer in op order. Beside the two
modules it hashes what the programs cannot say: the parameters' logical axes, which inputs
and outputs the backward reads (by position) and which inputs are differentiated. Names of
vars, layers and scopes never enter it, so identical transformer blocks hash the same, and the
hash is equal across terminals and pipes, processes, hash seeds and machines with one jax.
"""

import functools
import hashlib
import json
import re
from typing import Any

import jax
import numpy as np
from jax._src.interpreters import mlir as jax_mlir
from jaxlib.mlir import ir

from programs.check import ProgramProblem, check_programs, layer_forms
from programs.load import load_program
from schemas import LayerSpec, ModelSpec, VarSpec

# Bump when what is hashed changes: fingerprints of another version never match these.
FINGERPRINT_VERSION = 3

_MODULE_NAME = re.compile(r"^module @[\w.$-]+", re.MULTILINE)
_DEFINED = re.compile(r"func\.func (?:public |private |nested )?@([\w.$-]+)\(")


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


@functools.lru_cache(maxsize=4096)
def _program_facts(text: str) -> dict[str, Any]:
    """The canonical module's hash and what the module leaves to the `Exported` wrapper,
    cached by the program's text (identical layers share their program bytes)."""
    return _facts(load_program(text))


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
    """Shape (a symbolic batch dim as its expression, e.g. "2*b") and dtype name."""
    dims = [d if isinstance(d, int) else str(d) for d in aval.shape]
    return [dims, np.dtype(aval.dtype).name]


def _vars(vs: list[VarSpec]) -> list[list[Any]]:
    return [[list(v.shape), v.dtype] for v in vs]


def layer_fingerprint(layer: LayerSpec) -> str:
    """sha256 (hex) of a layer's canonical forward and backward programs and the facts about
    them that only its spec records. Raises what `load_program` raises for a bad program."""
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
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def with_fingerprints(spec: ModelSpec) -> ModelSpec:
    """`spec` with every layer's (and remat variant's) fingerprint set to the one its
    programs give."""
    layers = []
    for layer in spec.layers:
        variants = {
            n: v.model_copy(update={"fingerprint": layer_fingerprint(layer.variant(n))})
            for n, v in layer.remat_variants.items()
        }
        update: dict[str, Any] = {"fingerprint": layer_fingerprint(layer)}
        if variants:
            update["remat_variants"] = variants
        layers.append(layer.model_copy(update=update))
    return spec.model_copy(update={"layers": layers})


def fingerprint_problems(spec: ModelSpec) -> list[ProgramProblem]:
    """Layers (whose programs passed `check_programs`) with a stated fingerprint that is not
    their programs' own, or whose StableHLO module cannot be read."""
    problems = []
    for i, whole in enumerate(spec.layers):
        for prefix, layer in layer_forms(whole):
            try:
                computed = layer_fingerprint(layer)
            except Exception as e:  # noqa: BLE001 - a module jax cannot read is a bad spec
                problems.append(
                    ProgramProblem(
                        i, prefix + "forward", f"its StableHLO module cannot be read: {e}"
                    )
                )
                continue
            if layer.fingerprint and layer.fingerprint != computed:
                message = (
                    f"is {layer.fingerprint!r} but the layer's programs give {computed!r}: "
                    "fingerprints are computed from the programs (leave it empty, or trace "
                    f"with jax {jax.__version__})"
                )
                problems.append(ProgramProblem(i, prefix + "fingerprint", message))
    return problems


def verified(spec: ModelSpec) -> ModelSpec:
    """`spec` whose programs load and match their declared vars, with fingerprints computed
    from them. Raises `ValueError` naming every layer whose programs are wrong or whose
    stated fingerprint is not its programs' own."""
    problems = check_programs(spec) or fingerprint_problems(spec)
    if problems:
        raise ValueError("; ".join(str(p) for p in problems))
    return with_fingerprints(spec)
