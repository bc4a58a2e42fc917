"""Check a spec's layer programs against the vars it declares for them."""

import binascii
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import numpy as np

from programs.load import load_program
from schemas import FLOAT_DTYPES, LayerSpec, ModelSpec, VarSpec

Declared = list[tuple[str, VarSpec]]


@dataclass(frozen=True)
class ProgramProblem:
    """One way a layer's program disagrees with its spec: `layers[layer].field: message`."""

    layer: int
    field: str  # "forward" or "backward", or "remat_variants[name].forward" ...
    message: str

    def __str__(self) -> str:
        return f"layers[{self.layer}].{self.field}: {self.message}"


def layer_forms(layer: LayerSpec) -> list[tuple[str, LayerSpec]]:
    """The layer as written (prefix "") and under each of its remat variants (prefix
    "remat_variants['name']."), each as a plain layer."""
    forms = [("", layer.variant("as_written"))]
    forms += [(f"remat_variants[{n!r}].", layer.variant(n)) for n in layer.remat_variants]
    return forms


def expected_signatures(layer: LayerSpec) -> dict[str, tuple[Declared, Declared]]:
    """What each program must take and return, as (field name, declared var) pairs."""
    own = {v.name: v for v in [*layer.inputs, *layer.outputs]}
    params = _indexed("params", layer.params)
    return {
        "forward": (
            params + _indexed("inputs", layer.inputs),
            _indexed("outputs", layer.outputs) + _indexed("residuals", layer.residuals),
        ),
        "backward": (
            params
            + [(f"saved[{k}]", own[n]) for k, n in enumerate(layer.saved)]
            + _indexed("residuals", layer.residuals)
            + [
                (f"outputs[{k}] (cotangent)", v)
                for k, v in enumerate(layer.outputs)
                if v.dtype in FLOAT_DTYPES
            ],
            params + [(f"grad_inputs[{k}]", own[n]) for k, n in enumerate(layer.grad_inputs)],
        ),
    }


def check_programs(spec: ModelSpec) -> list[ProgramProblem]:
    """Deserialize every layer's forward and backward and compare their signatures with the
    declared vars (platforms aside: see `platform_problems`)."""
    problems: list[ProgramProblem] = []
    for i, whole in enumerate(spec.layers):
        for prefix, layer in layer_forms(whole):
            problems += _layer_problems(i, prefix, layer)
    return problems


def _layer_problems(i: int, prefix: str, layer: LayerSpec) -> list[ProgramProblem]:
    problems: list[ProgramProblem] = []
    for kind, (args, results) in expected_signatures(layer).items():
        where = prefix + kind
        if not getattr(layer, kind):
            problems.append(ProgramProblem(i, where, f"the layer's {kind} program is empty"))
            continue
        try:
            exp = load_program(getattr(layer, kind))
        except (binascii.Error, ValueError) as e:
            problems.append(ProgramProblem(i, where, f"not valid base64 ({e})"))
            continue
        except Exception as e:  # noqa: BLE001 - any deserialization failure is a bad spec
            problems.append(
                ProgramProblem(
                    i, where, f"cannot be deserialized by jax.export ({type(e).__name__})"
                )
            )
            continue
        problems += [ProgramProblem(i, where, m) for m in _signature(exp, args, results)]
    return problems


def platform_problems(spec: ModelSpec, platform: str) -> list[ProgramProblem]:
    """Programs not exported for `platform` (those that do not load: see `check_programs`)."""
    problems = []
    for i, whole in enumerate(spec.layers):
        for prefix, layer in layer_forms(whole):
            for kind in ("forward", "backward"):
                try:
                    exp = load_program(getattr(layer, kind))
                except Exception:  # noqa: BLE001 - reported by check_programs
                    continue
                if platform not in exp.platforms:
                    message = (
                        f"exported for {list(exp.platforms)}, not for this worker's {platform!r}"
                    )
                    problems.append(ProgramProblem(i, prefix + kind, message))
    return problems


def _signature(exp: jax.export.Exported, args: Declared, results: Declared) -> list[str]:
    errors: list[str] = []
    if exp.nr_devices != 1:
        errors.append(f"exported for {exp.nr_devices} devices, expected 1")
    for what, avals, declared in (
        ("argument", exp.in_avals, args),
        ("output", exp.out_avals, results),
    ):
        if len(avals) != len(declared):
            fields = " + ".join(dict.fromkeys(f.split("[")[0] for f, _ in declared)) or "nothing"
            verb = "takes" if what == "argument" else "returns"
            errors.append(f"{verb} {len(avals)} {what}s but {fields} declare {len(declared)}")
            continue
        for j, (aval, (field, var)) in enumerate(zip(avals, declared, strict=True)):
            shape = tuple(aval.shape)
            dtype = np.dtype(aval.dtype).name
            if not _shape_fits(shape, var.shape):
                errors.append(f"{what} {j} has shape {shape} but {field} declares {var.shape}")
            elif dtype != var.dtype:
                errors.append(f"{what} {j} has dtype {dtype} but {field} declares {var.dtype}")
    return errors


def _shape_fits(shape: tuple, declared: tuple[int, ...]) -> bool:
    """The program's shape admits the declared one: equal dims, a symbolic (batch) dim
    admitting any size (the spec states it at its traced size)."""
    if len(shape) != len(declared):
        return False
    return all(not isinstance(d, int) or d == v for d, v in zip(shape, declared, strict=True))


def _indexed(name: str, vs: Sequence[VarSpec]) -> Declared:
    return [(f"{name}[{k}]", v) for k, v in enumerate(vs)]
