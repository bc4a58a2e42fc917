"""Automatic layer clustering (Alpa's layer construction): cut equations into L layers that
balance FLOPs while few bytes cross the cuts."""

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax.extend import core

log = logging.getLogger(__name__)

# Allowed imbalance: a layer may cost up to (1 + eps) x the average; the first feasible wins.
EPSILONS: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.0, math.inf)
# Weight of the balance tie-breaker (sum of squared relative layer costs) against bytes.
_BALANCE_WEIGHT = 1e-3


def cut_bytes(
    eqns: Sequence[Any], outvars: Sequence[Any], can_cross: Callable[[Any], bool]
) -> np.ndarray:
    """bytes[p] = bytes of vars produced before equation p and used at or after it, p in 0..n.

    Cuts that would pass a var `can_cross` rejects cost infinity.
    """
    n = len(eqns)
    produced: dict[Any, int] = {}
    last_use: dict[Any, int] = {}
    for i, eqn in enumerate(eqns):
        for v in eqn.invars:
            if isinstance(v, core.Var) and v in produced:
                last_use[v] = i
        for v in eqn.outvars:
            produced[v] = i
    for v in outvars:
        if isinstance(v, core.Var) and v in produced:
            last_use[v] = n
    diff = np.zeros(n + 2)
    blocked: list[tuple[int, int]] = []
    for v, used in last_use.items():
        lo, hi = produced[v] + 1, used + 1
        if can_cross(v):
            size = math.prod(v.aval.shape) * getattr(v.aval.dtype, "itemsize", 0)
            diff[lo] += size  # a var made again after the cut (a PRNG key) costs nothing
            diff[hi] -= size
        else:
            blocked.append((lo, hi))
    out = np.cumsum(diff[:-1])
    for lo, hi in blocked:
        out[lo:hi] = math.inf
    out[0] = 0.0
    return out


def cluster_segments(
    flops: Sequence[float], cuts: np.ndarray, num_layers: int
) -> list[tuple[str, int, int]]:
    """Split n equations into `num_layers` `(name, lo, hi)` ranges.

    Minimises the bytes crossing the cuts subject to every layer costing at most (1 + eps)
    times the average FLOPs (eps from `EPSILONS`, smallest feasible first) and at least one
    FLOP; ties go to the better-balanced split.
    """
    n = len(flops)
    if num_layers < 1:
        raise ValueError(f"layers must be >= 1, got {num_layers}")
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(flops, dtype=np.float64))])
    total = prefix[-1]
    nonzero = int(np.count_nonzero(np.asarray(flops)))
    if num_layers > nonzero:
        raise ValueError(
            f"cannot cut {nonzero} equations with FLOPs into {num_layers} layers; ask for fewer"
        )
    avg = total / num_layers
    for eps in EPSILONS:
        bounds = _solve(prefix, cuts, num_layers, avg * (1 + eps), avg)
        if bounds is not None:
            log.debug("clustered %d equations into %d layers at eps=%s", n, num_layers, eps)
            return [(f"layer{k}", lo, hi) for k, (lo, hi) in enumerate(bounds)]
    raise ValueError(
        f"no cut into {num_layers} layers exists (each layer needs FLOPs; cuts must pass only "
        "supported dtypes and, in a model of modules, fall between them); ask for fewer"
    )


def _solve(
    prefix: np.ndarray, cuts: np.ndarray, num_layers: int, limit: float, avg: float
) -> list[tuple[int, int]] | None:
    n = len(prefix) - 1
    best = np.full((num_layers + 1, n + 1), np.inf)
    choice = np.zeros((num_layers + 1, n + 1), dtype=np.int64)
    best[0, 0] = 0.0
    idx = np.arange(n + 1)
    for q in range(1, num_layers + 1):
        # The layer q covers equations i..j-1; it is preceded by a cut at i (free for i = 0).
        start_cost = best[q - 1] + np.where(idx == 0, 0.0, cuts)
        for j in range(q, n + 1):
            cost = prefix[j] - prefix[:j]
            ok = (cost <= limit * (1 + 1e-9)) & (cost > 0)
            value = start_cost[:j] + _BALANCE_WEIGHT * (cost / max(avg, 1.0)) ** 2
            value = np.where(ok, value, np.inf)
            i = int(np.argmin(value))
            best[q, j] = value[i]
            choice[q, j] = i
    if not math.isfinite(best[num_layers, n]):
        return None
    bounds: list[tuple[int, int]] = []
    j = n
    for q in range(num_layers, 0, -1):
        i = int(choice[q, j])
        bounds.append((i, j))
        j = i
    return bounds[::-1]
