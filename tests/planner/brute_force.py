"""Brute-force stage planning: enumerate every split and every (submesh, config)."""

import math
from collections.abc import Iterator

import numpy as np

Stage = tuple[int, int, int, int]


def all_plans(cost: np.ndarray, sizes: list[int], num_devices: int) -> Iterator[list[Stage]]:
    """Every plan covering all layers in order with finite-cost stages on exactly the devices."""
    num_layers, _, num_submeshes, num_configs = cost.shape

    def extend(start: int, left: int) -> Iterator[list[Stage]]:
        if start == num_layers:
            if left == 0:
                yield []
            return
        for end in range(start, num_layers):
            for m in range(num_submeshes):
                if sizes[m] > left:
                    continue
                for c in range(num_configs):
                    if math.isfinite(cost[start, end, m, c]):
                        for rest in extend(end + 1, left - sizes[m]):
                            yield [(start, end, m, c), *rest]

    yield from extend(0, num_devices)


def brute_training(
    cost: np.ndarray,
    mns: np.ndarray | None,
    sizes: list[int],
    num_devices: int,
    num_microbatches: int,
) -> float:
    """Least `sum + (B-1) max` over all plans obeying `stages after <= max_n_succ_stages`."""
    best = math.inf
    for plan in all_plans(cost, sizes, num_devices):
        n = len(plan)
        if mns is not None and any(n - 1 - p > mns[s] for p, s in enumerate(plan)):
            continue
        costs = [float(cost[s]) for s in plan]
        best = min(best, sum(costs) + (num_microbatches - 1) * max(costs))
    return best


def brute_inference(
    cost: np.ndarray, mns: np.ndarray | None, sizes: list[int], num_devices: int
) -> float:
    """Least largest stage time over all plans whose stages fit (`max_n_succ_stages >= 0`)."""
    best = math.inf
    for plan in all_plans(cost, sizes, num_devices):
        if mns is not None and any(mns[s] < 0 for s in plan):
            continue
        best = min(best, max(float(cost[s]) for s in plan))
    return best


def brute_sum_max(
    a: np.ndarray,
    b: np.ndarray,
    allow: np.ndarray,
    sizes: list[int],
    num_devices: int,
    weight: float,
    num_stages: int = 0,
) -> float:
    """Least `Σ a + weight · max b` over all plans whose every stage is allowed with the
    stages after it (`allow[min(q, Q - 1)]`); exactly `num_stages` stages when given."""
    best = math.inf
    rows = allow.shape[0]
    for plan in all_plans(a[..., None], sizes, num_devices):
        n = len(plan)
        if num_stages and n != num_stages:
            continue
        stages = [(i, e, m) for i, e, m, _ in plan]
        if any(not allow[min(n - 1 - p, rows - 1), i, e, k] for p, (i, e, k) in enumerate(stages)):
            continue
        if not all(math.isfinite(b[s]) for s in stages):
            continue
        value = sum(float(a[s]) for s in stages) + weight * max(float(b[s]) for s in stages)
        best = min(best, value)
    return best
