"""Compose a stage from a `ModelSpec`'s layer programs (deserialized `jax.export` modules).

A layer's program takes its params (in `params` order) then its inputs (in `inputs` order)
and returns a tuple of its outputs, in order (see `schemas.model`).
"""

import base64
import binascii
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import numpy as np

from schemas import LayerSpec, ModelSpec, ParamSpec, VarSpec
from workers.fingerprint import stage_io

log = logging.getLogger(__name__)

_CACHE_SIZE = 512
_cache: OrderedDict[str, jax.export.Exported] = OrderedDict()


@dataclass(frozen=True)
class StageProgram:
    """Layers start..end as one function `fn(params, inputs) -> outputs`."""

    params: list[ParamSpec]  # every layer's params, in layer order (shared ones once)
    inputs: list[VarSpec]  # vars read from outside the stage, in order of first use
    outputs: list[VarSpec]  # vars used after `end` (or the loss), in production order
    fn: Callable[[Sequence[jax.Array], Sequence[jax.Array]], tuple[jax.Array, ...]]


def load_layer(layer: LayerSpec) -> jax.export.Exported:
    """Deserialize a layer's program (base64 → `jax.export.deserialize`), cached by its hash."""
    key = hashlib.sha256(layer.program.encode("ascii")).hexdigest()
    exported = _cache.get(key)
    if exported is None:
        raw = base64.b64decode(layer.program.encode("ascii"), validate=True)
        exported = jax.export.deserialize(bytearray(raw))
        _cache[key] = exported
        if len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    else:
        _cache.move_to_end(key)
    return exported


def compose_stage(spec: ModelSpec, start: int, end: int) -> StageProgram:
    """The stage of layers `start..end` (inclusive) as a jittable, differentiable function."""
    if not 0 <= start <= end < spec.num_layers:
        raise ValueError(f"bad layer range {start}..{end} for {spec.num_layers} layers")
    layers = spec.layers[start : end + 1]
    params: dict[str, ParamSpec] = {}
    for layer in layers:
        for p in layer.params:
            params.setdefault(p.name, p)
    inputs, outputs = stage_io(spec, start, end)
    exported = [load_layer(layer) for layer in layers]
    param_names = list(params)
    input_names = [v.name for v in inputs]
    output_names = [v.name for v in outputs]

    def fn(
        param_values: Sequence[jax.Array], input_values: Sequence[jax.Array]
    ) -> tuple[jax.Array, ...]:
        env = dict(zip(param_names, param_values, strict=True))
        env.update(zip(input_names, input_values, strict=True))
        for layer, exp in zip(layers, exported, strict=True):
            args = [env[p.name] for p in layer.params] + [env[v.name] for v in layer.inputs]
            env.update(zip((v.name for v in layer.outputs), exp.call(*args), strict=True))
        return tuple(env[name] for name in output_names)

    return StageProgram(params=list(params.values()), inputs=inputs, outputs=outputs, fn=fn)


def _aval_str(shape: tuple[int, ...], dtype: str) -> str:
    return f"{dtype}{list(shape)}"


def check_programs(spec: ModelSpec) -> list[str]:
    """Deserialize every layer and compare its signature with the declared vars.

    Returns one message per violation, naming the layer and field; empty when all is well.
    """
    errors: list[str] = []
    for i, layer in enumerate(spec.layers):
        where = f"layers[{i}].program"
        try:
            exp = load_layer(layer)
        except (binascii.Error, ValueError) as e:
            errors.append(f"{where}: not valid base64 ({e})")
            continue
        except Exception as e:  # noqa: BLE001 - any deserialization failure is a bad spec
            errors.append(f"{where}: cannot be deserialized by jax.export ({type(e).__name__})")
            continue
        declared_in = [("params", p) for p in layer.params] + [("inputs", v) for v in layer.inputs]
        platform = jax.export.default_export_platform()
        if platform not in exp.platforms:
            errors.append(
                f"{where}: exported for {list(exp.platforms)}, not for this worker's {platform!r}"
            )
        if exp.nr_devices != 1:
            errors.append(f"{where}: exported for {exp.nr_devices} devices, expected 1")
        if not exp.has_vjp():
            errors.append(f"{where}: serialized without its VJP (use vjp_order=1)")
        if len(exp.in_avals) != len(declared_in):
            errors.append(
                f"{where}: takes {len(exp.in_avals)} arguments but params + inputs declare "
                f"{len(declared_in)}"
            )
        else:
            k = {"params": 0, "inputs": 0}
            for j, (aval, (field, var)) in enumerate(zip(exp.in_avals, declared_in, strict=True)):
                errors += _compare(where, f"argument {j}", aval, f"{field}[{k[field]}]", var)
                k[field] += 1
        if len(exp.out_avals) != len(layer.outputs):
            errors.append(
                f"{where}: returns {len(exp.out_avals)} values but outputs declares "
                f"{len(layer.outputs)}"
            )
        else:
            for j, (aval, var) in enumerate(zip(exp.out_avals, layer.outputs, strict=True)):
                errors += _compare(where, f"output {j}", aval, f"outputs[{j}]", var)
    return errors


def _compare(
    where: str, what: str, aval: jax.core.ShapedArray, field: str, var: VarSpec
) -> list[str]:
    shape = tuple(aval.shape)
    dtype = np.dtype(aval.dtype).name
    if shape != var.shape:
        return [f"{where}: {what} has shape {shape} but {field} declares {var.shape}"]
    if dtype != var.dtype:
        return [f"{where}: {what} has dtype {dtype} but {field} declares {var.dtype}"]
    return []
