"""Timing compiled modules, the per-candidate deadline, and the arrays they run on."""

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from workers.stage_modules import FLOAT_DTYPES


class CandidateTimeout(Exception):
    """The candidate ran past its wall-clock limit; `phase` says where."""

    def __init__(self, phase: str, elapsed_s: float, limit_s: float):
        super().__init__(
            f"timed out in phase '{phase}' after {elapsed_s:.3f} s (limit {limit_s:g} s); "
            "the limit is checked between phases and runs, a hard limit is the runner's"
        )
        self.phase = phase


class Deadline:
    """A wall-clock budget checked between phases: XLA compiles cannot be interrupted
    in-process, so a hard limit is enforced by the runner killing the worker."""

    def __init__(self, limit_s: float, clock: Callable[[], float] = time.perf_counter):
        self.limit_s = limit_s
        self._clock = clock
        self._start = clock()

    @property
    def elapsed_s(self) -> float:
        return self._clock() - self._start

    def check(self, phase: str) -> None:
        """Raise `CandidateTimeout` when the budget is spent (after `phase`)."""
        elapsed = self.elapsed_s
        if elapsed > self.limit_s:
            raise CandidateTimeout(phase, elapsed, self.limit_s)


def random_array(struct: Any, seed: int) -> jax.Array:
    """A device array for `struct` (ShapeDtypeStruct with sharding): small normal values for
    floating types, zeros for integer and bool ones (valid token ids and labels)."""
    dtype = np.dtype(struct.dtype)
    if dtype.name in FLOAT_DTYPES:
        host = np.random.default_rng(seed).standard_normal(struct.shape, dtype=np.float32)
        host = (host * 0.02).astype(dtype)
    else:
        host = np.zeros(struct.shape, dtype)
    return jax.device_put(host, struct.sharding)


def time_runs(
    run: Callable[[], Any], warmup: int, repeats: int, deadline: Deadline, phase: str
) -> tuple[list[float], Any]:
    """`warmup` untimed then `repeats` timed calls of `run`, each ended by
    `block_until_ready`. Returns the samples (seconds) and the last result."""
    out = None
    for _ in range(warmup):
        out = None
        out = jax.block_until_ready(run())
        deadline.check(f"{phase} warm-up")
    samples = []
    for _ in range(repeats):
        out = None
        t0 = time.perf_counter()
        out = jax.block_until_ready(run())
        samples.append(time.perf_counter() - t0)
        deadline.check(phase)
    return samples, out


def median(samples: list[float]) -> float:
    """Median of the samples, 0.0 when there are none."""
    return float(statistics.median(samples)) if samples else 0.0
