"""Memory accounting: per-device sizes from shardings and peaks from `memory_analysis()`."""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

from schemas import DTYPE_BYTES, ParamSpec


def per_device_bytes(shape: Sequence[int], dtype: Any, sharding: Sharding | None) -> int:
    """Bytes one device holds of an array of `shape`/`dtype` laid out by `sharding`."""
    local = tuple(shape) if sharding is None else sharding.shard_shape(tuple(shape))
    itemsize = np.dtype(dtype).itemsize if not isinstance(dtype, str) else DTYPE_BYTES[dtype]
    return int(math.prod(local)) * itemsize


def array_bytes(x: Any) -> int:
    """Bytes one device holds of a (possibly sharded) array or ShapeDtypeStruct."""
    return per_device_bytes(x.shape, x.dtype, getattr(x, "sharding", None))


@dataclass(frozen=True)
class ModuleMemory:
    """What `Compiled.memory_analysis()` says about one module, per device, in bytes."""

    peak: int
    temp: int
    argument: int
    output: int
    alias: int


# Backends whose `peak_memory_in_bytes` is a heap simulation over the whole program
# (temporaries included). XLA's CPU figure is set but leaves temporaries out.
HEAP_SIMULATED_PEAK = frozenset({"gpu", "cuda", "rocm"})


def _platform(compiled: jax.stages.Compiled) -> str:
    try:
        sharding = jax.tree_util.tree_leaves(compiled.input_shardings)[0]
        return next(iter(sharding.device_set)).platform
    except (IndexError, AttributeError, StopIteration):
        return jax.default_backend()


def module_memory(compiled: jax.stages.Compiled) -> ModuleMemory:
    """Memory per device of a compiled module (zeros when the backend reports nothing).

    peak = XLA's heap-simulated `peak_memory_in_bytes` on backends that compute one (GPU),
    else arguments + outputs + temporaries - aliased bytes (the CPU figure omits temps)."""
    stats = compiled.memory_analysis()
    if stats is None:
        return ModuleMemory(0, 0, 0, 0, 0)
    argument = int(getattr(stats, "argument_size_in_bytes", 0) or 0)
    output = int(getattr(stats, "output_size_in_bytes", 0) or 0)
    alias = int(getattr(stats, "alias_size_in_bytes", 0) or 0)
    temp = int(getattr(stats, "temp_size_in_bytes", 0) or 0)
    peak = int(getattr(stats, "peak_memory_in_bytes", 0) or 0)
    if peak <= 0 or _platform(compiled) not in HEAP_SIMULATED_PEAK:
        peak = max(0, argument + output - alias + temp)
    return ModuleMemory(peak=peak, temp=temp, argument=argument, output=output, alias=alias)


# Optimizer state per parameter, in parameter-sized copies (Adam: mu and nu; SGD: none).
OPTIMIZER_STATE_COPIES: dict[str, int] = {"sgd": 0, "adam": 2}


def estimate_initial_bytes(
    params: Sequence[ParamSpec], shardings: Sequence[Sharding], optimizer: str
) -> int:
    """Parameters + optimizer state per device, before anything is compiled."""
    param_bytes = sum(
        per_device_bytes(p.shape, p.dtype, s) for p, s in zip(params, shardings, strict=True)
    )
    return param_bytes * (1 + OPTIMIZER_STATE_COPIES[optimizer])
