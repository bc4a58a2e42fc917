"""Timing compiled modules, the per-candidate deadline, and the arrays they run on."""

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from schemas import FLOAT_DTYPES
from schemas.settings import env_name, env_settings
from workers.measure.group_sync import all_processes, any_process

ENV_CLOCK = env_name("timing_clock")  # wall (default) or cpu


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
        """Raise `CandidateTimeout` when the budget is spent (after `phase`); in a group of
        processes, in all of them when it is spent in any (`workers.measure.group_sync`)."""
        elapsed = self.elapsed_s
        if any_process(elapsed > self.limit_s):
            raise CandidateTimeout(phase, elapsed, self.limit_s)


def random_array(struct: jax.ShapeDtypeStruct, seed: int) -> jax.Array:
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
    run: Callable[[], Any],
    warmup: int,
    repeats: int,
    deadline: Deadline,
    phase: str,
    *,
    max_repeats: int | None = None,
    target_spread: float | None = None,
    budget_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[float], Any]:
    """`warmup` untimed then at least `repeats` timed calls of `run`, each ended by
    `block_until_ready`. With `max_repeats` and `target_spread`, timed calls go on until
    `relative_spread` of the samples is at most `target_spread`, there are `max_repeats`
    of them, or (with `budget_s`) the timed calls add up to `budget_s`; in a group of
    processes, until that holds in every one of them. The deadline is checked after each
    call. Returns the samples (seconds of `clock`) and the last result."""
    out = None
    for _ in range(warmup):
        out = None
        out = jax.block_until_ready(run())
        deadline.check(f"{phase} warm-up")
    cap = repeats if max_repeats is None or target_spread is None else max(repeats, max_repeats)
    samples: list[float] = []
    while True:
        enough = len(samples) >= cap or (
            len(samples) >= repeats
            and (
                relative_spread(samples) <= (target_spread or 0.0)
                or (budget_s is not None and sum(samples) >= budget_s)
            )
        )
        # A group of processes stops together: once every one of them has enough.
        if all_processes(enough):
            break
        out = None
        t0 = clock()
        out = jax.block_until_ready(run())
        samples.append(clock() - t0)
        deadline.check(phase)
    return samples, out


def clock_for(devices: Sequence[jax.Device]) -> Callable[[], float]:
    """The clock to time programs on `devices`: wall time (`perf_counter`), unless
    `$STAGEPROF_TIMING_CLOCK=cpu` asks for this process's CPU time on all-CPU devices.

    CPU time is the least moved by other processes' load (bench/timing_clock.py), but on
    virtual CPU devices it sums every device's thread, so a stage on 2 devices costs ~1.8x
    its wall time and the planner would rank submeshes by work instead of by time; wall time
    is what a step takes, and the quiet sections (`workers.measure.quiet`) keep our own actors'
    compiles out of it. A GPU's work is never CPU time: wall time there, whatever is set."""
    all_cpu = bool(devices) and all(getattr(d, "platform", "") == "cpu" for d in devices)
    if env_settings().timing_clock == "cpu" and all_cpu:
        return time.process_time
    return time.perf_counter


def median(samples: Sequence[float]) -> float:
    """Median of the samples, 0.0 when there are none."""
    return float(statistics.median(samples)) if samples else 0.0


def relative_spread(samples: Sequence[float]) -> float:
    """(p90 - p10) / median of the samples (linear percentiles); 0.0 for fewer than two
    samples or a median of zero."""
    if len(samples) < 2:
        return 0.0
    mid = median(samples)
    if mid <= 0:
        return 0.0
    p10, p90 = np.percentile(np.asarray(samples, dtype=np.float64), [10, 90])
    return float(p90 - p10) / mid
