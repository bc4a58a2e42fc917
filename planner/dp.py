"""Alpa's stage DP (`training_dp`, `inference_dp`), exact and vectorised with numpy.

Inputs are Alpa's: `compute_cost[start, end, submesh, config]` (shape `[L, L, S, C]`, `end`
inclusive, seconds, `inf` = infeasible or not measured) and `max_n_succ_stages` of the same
shape (how many stages may follow a stage before its stashed activations overflow memory).

Alpa's recurrence, for a bound `t_max` on any stage's cost:
`f[s, i, d]` = least summed cost of covering layers `i..L-1` with `s` stages on exactly `d`
devices, each stage `(i, k-1, m, c)` with `cost <= t_max` and `s - 1 <= max_n_succ_stages`::

    f[s, i, d] = min_{k > i, m, c} f[s-1, k, d - devices(m)] + cost[i, k-1, m, c]

and the plan's objective is `sum + (B - 1) * max` over its stages. Alpa solves the
recurrence for every distinct `t_max` in increasing order and stops once `B * t_max` reaches
the best objective found. Here the recurrence is vectorised over stage counts, next-stage
starts and device counts (configs are reduced up front: for a fixed memory row the cheapest
feasible config is the only one that matters), and the bounds are walked from the top down:
solving at `t` gives a plan whose largest stage `M <= t` has the least sum for every bound in
`[M, t]`, so the next bound to solve is the largest cost below `M` (and below `best / B`,
Alpa's stop rule). This skips every bound that cannot change the answer, so it solves a
handful of bounds where Alpa solves thousands, and it is exact: it returns the optimum of
enumerating every split and every (submesh, config) that uses all devices within the
memory rule. Alpa's 1e-6 gap between bounds is not needed (and would cost exactness).
"""

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from schemas import SubmeshShape

logger = logging.getLogger(__name__)

Stage = tuple[int, int, int, int]
SubmeshLike = tuple[int, int] | SubmeshShape


@dataclass(frozen=True)
class DPResult:
    """A DP answer: `cost` (inf when no plan exists) and `stages` as
    `(start, end_inclusive, submesh_id, config_id)`, first stage first."""

    cost: float
    stages: list[Stage] = field(default_factory=list)
    num_bounds_solved: int = 0

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.cost)


@dataclass(frozen=True)
class _Table:
    """Validated inputs, reduced over configs.

    `best[q, i, e, m]`: least cost of layers `i..e` on submesh `m` over the configs allowed
    when `q` stages follow (the last row `Q-1` stands for every `q >= Q-1`); `arg` its config.
    """

    cost: NDArray[np.float64]
    best: NDArray[np.float64]
    arg: NDArray[np.int64]
    sizes: NDArray[np.int64]
    num_devices: int

    @property
    def num_layers(self) -> int:
        return int(self.cost.shape[0])


def _where(mask: NDArray[np.bool_]) -> str:
    idx = tuple(int(x) for x in np.argwhere(mask)[0])
    return f"[start, end, submesh, config] = {idx} ({int(mask.sum())} entries)"


def _submesh_sizes(submesh_choices: Sequence[SubmeshLike]) -> NDArray[np.int64]:
    sizes = []
    for s in submesh_choices:
        hosts, devices = s.as_tuple() if isinstance(s, SubmeshShape) else s
        if hosts < 1 or devices < 1:
            raise ValueError(f"submesh {s} must have positive sizes")
        sizes.append(int(hosts) * int(devices))
    return np.array(sizes, dtype=np.int64)


def validate_inputs(
    compute_cost: ArrayLike,
    max_n_succ_stages: ArrayLike | None,
    submesh_choices: Sequence[SubmeshLike],
    num_devices: int,
) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]:
    """Check shapes and values; NaN and negative costs are refused with a ValueError.

    Returns float64 costs (entries with start > end set to inf), integer max_n_succ_stages
    (None means unlimited; non-finite or NaN-free floats are floored; -inf gives -1) and the
    device count of each submesh.
    """
    cost = np.array(compute_cost, dtype=np.float64)
    if cost.ndim != 4 or cost.shape[0] != cost.shape[1] or cost.shape[0] < 1:
        raise ValueError(f"compute_cost must have shape [L, L, S, C] with L >= 1, got {cost.shape}")
    sizes = _submesh_sizes(submesh_choices)
    if cost.shape[2] != len(sizes):
        raise ValueError(
            f"compute_cost has {cost.shape[2]} submeshes but {len(sizes)} submesh choices"
        )
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    nan = np.isnan(cost)
    if nan.any():
        raise ValueError(f"compute_cost is NaN at {_where(nan)}")
    if (cost < 0).any():
        raise ValueError(f"compute_cost is negative at {_where(cost < 0)}")
    if max_n_succ_stages is None:
        mns = np.full(cost.shape, np.iinfo(np.int64).max, dtype=np.int64)
    else:
        raw = np.asarray(max_n_succ_stages)
        if raw.shape != cost.shape:
            raise ValueError(
                f"max_n_succ_stages has shape {raw.shape}, compute_cost has {cost.shape}"
            )
        if raw.dtype.kind == "f":
            if np.isnan(raw).any():
                raise ValueError(f"max_n_succ_stages is NaN at {_where(np.isnan(raw))}")
            big = float(np.iinfo(np.int64).max // 2)
            mns = np.floor(np.clip(raw, -1.0, big)).astype(np.int64)
        elif raw.dtype.kind in "iub":
            mns = raw.astype(np.int64)
        else:
            raise ValueError(f"max_n_succ_stages must be numeric, got dtype {raw.dtype}")
    num_layers = cost.shape[0]
    lower = np.tril(np.ones((num_layers, num_layers), dtype=bool), k=-1)
    cost[lower] = np.inf
    return cost, mns, sizes


def reduce_configs(
    cost: NDArray[np.float64],
    mns: NDArray[np.int64],
    sizes: NDArray[np.int64],
    num_devices: int,
    use_memory_rule: bool = True,
) -> _Table:
    """Reduce `[L, L, S, C]` to the cheapest allowed config per memory row (see `_Table`)."""
    num_layers, _, num_submeshes, num_configs = cost.shape
    cap = min(num_layers, num_devices) - 1  # most stages that can follow any stage
    clipped = np.clip(mns, -1, cap)
    usable = np.isfinite(cost) & (clipped >= 0) & (sizes <= num_devices)[None, None, :, None]
    if not use_memory_rule:
        clipped = np.where(clipped >= 0, cap, -1)
    binding = clipped[usable & (clipped < cap)]
    rows = int(binding.max()) + 2 if binding.size else 1
    # A config whose limit is >= rows - 1 is past every binding limit, so it saturates at cap.
    level = np.where(usable, np.minimum(clipped, rows - 1), -1)
    shape = (rows + 1, num_layers, num_layers, num_submeshes)
    exact = np.full(shape, np.inf)  # exact[v]: cheapest config whose level is exactly v
    exact_arg = np.zeros(shape, dtype=np.int64)
    for c in range(num_configs):
        idx = (level[..., c] + 1)[None]  # slot 0 collects the unusable (-1)
        current = np.take_along_axis(exact, idx, axis=0)[0]
        better = cost[..., c] < current
        np.put_along_axis(exact, idx, np.where(better, cost[..., c], current)[None], axis=0)
        old = np.take_along_axis(exact_arg, idx, axis=0)[0]
        np.put_along_axis(exact_arg, idx, np.where(better, c, old)[None], axis=0)
    best = np.empty((rows, num_layers, num_layers, num_submeshes))
    arg = np.zeros(best.shape, dtype=np.int64)
    best[rows - 1], arg[rows - 1] = exact[rows], exact_arg[rows]
    for q in range(rows - 2, -1, -1):  # allowed with q followers: any level >= q
        take = exact[q + 1] < best[q + 1]
        best[q] = np.where(take, exact[q + 1], best[q + 1])
        arg[q] = np.where(take, exact_arg[q + 1], arg[q + 1])
    return _Table(cost=cost, best=best, arg=arg, sizes=sizes, num_devices=num_devices)


def solve_bound(table: _Table, t_max: float, combine: str = "sum") -> list[Stage] | None:
    """Alpa's recurrence under `t_max`: the least-sum plan (or least-max, `combine="max"`)."""
    best, sizes, devices = table.best, table.sizes, table.num_devices
    rows, num_layers = best.shape[0], best.shape[1]
    off = devices  # device axis offset so that `d - devices(m) < 0` reads inf
    width = off + devices + 1
    # f[r]: r stages (row `rows` = every count >= rows); prev[r] feeds target row r + 1.
    f = np.full((rows + 1, num_layers + 1, width), np.inf)
    f[0, num_layers, off] = 0.0
    prev = np.full((rows, num_layers + 1, width), np.inf)
    prev[0, num_layers, off] = 0.0
    from_bucket = np.zeros((num_layers + 1, width), dtype=bool)
    arg_k = np.zeros((rows + 1, num_layers + 1, devices + 1), dtype=np.int32)
    arg_m = np.zeros((rows + 1, num_layers + 1, devices + 1), dtype=np.int32)
    op = np.add if combine == "sum" else np.maximum
    for i in range(num_layers - 1, -1, -1):
        g = best[:, i, i:, :]  # [rows, L - i, S]; end e = i.. ↔ next start k = e + 1
        g = np.where(g <= t_max, g, np.inf)
        top = np.full((rows, devices + 1), np.inf)
        top_k = np.zeros((rows, devices + 1), dtype=np.int32)
        top_m = np.zeros((rows, devices + 1), dtype=np.int32)
        for sub in np.flatnonzero(np.isfinite(g).any(axis=(0, 1))).tolist():
            n = int(sizes[sub])
            cand = op(prev[:, i + 1 :, off - n : off - n + devices + 1], g[:, :, sub, None])
            k = cand.argmin(axis=1)
            val = np.take_along_axis(cand, k[:, None, :], axis=1)[:, 0, :]
            better = val < top
            top = np.where(better, val, top)
            top_k = np.where(better, k + i + 1, top_k)
            top_m = np.where(better, sub, top_m)
        f[1:, i, off:] = top
        arg_k[1:, i], arg_m[1:, i] = top_k, top_m
        prev[: rows - 1, i] = f[: rows - 1, i]
        from_bucket[i] = f[rows, i] < f[rows - 1, i]
        prev[rows - 1, i] = np.minimum(f[rows - 1, i], f[rows, i])
    final = f[1:, 0, off + devices]
    if not np.isfinite(final).any():
        return None
    r, i, d = int(final.argmin()) + 1, 0, devices
    stages: list[Stage] = []
    while i < num_layers:
        k, m = int(arg_k[r, i, d]), int(arg_m[r, i, d])
        stages.append((i, k - 1, m, int(table.arg[r - 1, i, k - 1, m])))
        d -= int(sizes[m])
        r = rows if r == rows and from_bucket[k, off + d] else r - 1
        i = k
    if r != 0 or d != 0:
        raise AssertionError(f"DP backtrack ended at row {r} with {d} devices left")
    return stages


def stage_costs(cost: NDArray[np.float64], stages: Sequence[Stage]) -> list[float]:
    """The table's cost of each stage."""
    return [float(cost[s]) for s in stages]


def pipeline_cost(costs: Sequence[float], num_microbatches: int) -> float:
    """Alpa's objective: `sum(t) + (B - 1) * max(t)`, summed first stage first."""
    return float(sum(costs) + (num_microbatches - 1) * max(costs))


def training_dp(
    compute_cost: ArrayLike,
    max_n_succ_stages: ArrayLike | None,
    submesh_choices: Sequence[SubmeshLike],
    num_devices: int,
    num_microbatches: int,
) -> DPResult:
    """Pipeline stages minimising `sum(t) + (B-1) * max(t)` on exactly `num_devices`.

    `compute_cost`, `max_n_succ_stages`: shape `[L, L, S, C]` indexed
    `[start, end_inclusive, submesh, config]`; inf cost = infeasible or missing; a stage
    with `s` stages after it needs `s <= max_n_succ_stages` (None: no memory limit).
    Returns `DPResult(cost=inf, stages=[])` when no plan exists; ValueError on NaN.
    """
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    cost, mns, sizes = validate_inputs(
        compute_cost, max_n_succ_stages, submesh_choices, num_devices
    )
    table = reduce_configs(cost, mns, sizes, num_devices)
    bounds = np.unique(table.best[np.isfinite(table.best)])
    best_cost, best_stages, solved = math.inf, [], 0
    t_max = math.inf
    while True:
        stages = solve_bound(table, t_max)
        solved += 1
        if stages is None:
            break
        costs = stage_costs(cost, stages)
        value = pipeline_cost(costs, num_microbatches)
        if value < best_cost:
            best_cost, best_stages = value, stages
        # Every bound in [max(costs), t_max] gives the same least sum: go below it, and below
        # best / B (a plan whose largest stage is t costs at least B * t).
        idx = min(
            int(np.searchsorted(bounds, max(costs), side="left")),
            int(np.searchsorted(bounds, best_cost / num_microbatches, side="right")),
        )
        idx -= 1
        while idx >= 0 and bounds[idx] * num_microbatches >= best_cost:
            idx -= 1
        if idx < 0:
            break
        t_max = float(bounds[idx])
    logger.debug("training_dp: %d bounds solved, cost %s", solved, best_cost)
    return DPResult(cost=best_cost, stages=best_stages, num_bounds_solved=solved)


def inference_dp(
    compute_cost: ArrayLike,
    max_n_succ_stages: ArrayLike | None,
    submesh_choices: Sequence[SubmeshLike],
    num_devices: int,
) -> DPResult:
    """Pipeline stages minimising the largest stage time (a pipeline's throughput bound).

    Same inputs as `training_dp`; nothing is stashed for a backward pass, so the 1F1B rule
    does not apply and only `max_n_succ_stages < 0` (does not fit at all) excludes a
    candidate. Among plans with the least largest stage it returns one with the least sum.
    `cost` is the largest stage time. (Alpa's `inference_dp` multiplies it by the stage count.)
    """
    cost, mns, sizes = validate_inputs(
        compute_cost, max_n_succ_stages, submesh_choices, num_devices
    )
    table = reduce_configs(cost, mns, sizes, num_devices, use_memory_rule=False)
    bottleneck = solve_bound(table, math.inf, combine="max")
    if bottleneck is None:
        return DPResult(cost=math.inf, stages=[], num_bounds_solved=1)
    t_max = max(stage_costs(cost, bottleneck))
    stages = solve_bound(table, t_max) or bottleneck
    return DPResult(cost=max(stage_costs(cost, stages)), stages=stages, num_bounds_solved=2)
