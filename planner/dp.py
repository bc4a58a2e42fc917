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
feasible config is the only one that matters), and the bounds are walked from the top down
(`_BoundSearch`): solving at `t` gives a plan whose largest stage `M <= t` has the least sum
for every bound in `[M, t]`, so the next bound is the largest one below `M`, and only while
`least sum + (B - 1) * bound` (or Alpa's `B * t_max`) is below the best objective; nothing
lies below the least largest stage of any plan (one max-plus solve of the same recurrence).
This solves a handful of bounds where Alpa solves hundreds, and it is exact: it returns the
optimum of enumerating every split and every (submesh, config) that uses all devices
within the memory rule. Alpa's 1e-6 gap between bounds is not needed (and would cost
exactness).
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
MAX_TABLE_BYTES = 2 * 2**30  # working arrays of one DP; beyond it, refuse instead of swapping
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
    arg: NDArray[np.int16]
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
    if num_configs > np.iinfo(np.int16).max:
        raise ValueError(f"at most {np.iinfo(np.int16).max} configs per submesh, got {num_configs}")
    cap = min(num_layers, num_devices) - 1  # most stages that can follow any stage
    clipped = np.clip(mns, -1, cap)
    usable = np.isfinite(cost) & (clipped >= 0) & (sizes <= num_devices)[None, None, :, None]
    if not use_memory_rule:
        clipped = np.where(clipped >= 0, cap, -1)
    binding = clipped[usable & (clipped < cap)]
    rows = int(binding.max()) + 2 if binding.size else 1
    # A config whose limit is >= rows - 1 is past every binding limit, so it saturates at cap.
    level = np.where(usable, np.minimum(clipped, rows - 1), -1)
    need = (2 * rows + 1) * num_layers * num_layers * num_submeshes * 10  # float64 + int16
    if need > MAX_TABLE_BYTES:
        raise ValueError(
            f"the reduced table would take {need / 2**30:.1f} GiB ({rows} memory rows x "
            f"{num_layers}^2 ranges x {num_submeshes} submeshes); the limit is "
            f"{MAX_TABLE_BYTES / 2**30:.0f} GiB: use fewer layers"
        )
    shape = (rows + 1, num_layers, num_layers, num_submeshes)
    exact = np.full(shape, np.inf)  # exact[v]: cheapest config whose level is exactly v
    exact_arg = np.zeros(shape, dtype=np.int16)
    for c in range(num_configs):
        idx = (level[..., c] + 1)[None]  # slot 0 collects the unusable (-1)
        current = np.take_along_axis(exact, idx, axis=0)[0]
        better = cost[..., c] < current
        np.put_along_axis(exact, idx, np.where(better, cost[..., c], current)[None], axis=0)
        old = np.take_along_axis(exact_arg, idx, axis=0)[0]
        np.put_along_axis(exact_arg, idx, np.where(better, c, old)[None], axis=0)
    best = np.empty((rows, num_layers, num_layers, num_submeshes))
    arg = np.zeros(best.shape, dtype=np.int16)
    best[rows - 1], arg[rows - 1] = exact[rows], exact_arg[rows]
    for q in range(rows - 2, -1, -1):  # allowed with q followers: any level >= q
        take = exact[q + 1] < best[q + 1]
        best[q] = np.where(take, exact[q + 1], best[q + 1])
        arg[q] = np.where(take, exact_arg[q + 1], arg[q + 1])
    return _Table(cost=cost, best=best, arg=arg, sizes=sizes, num_devices=num_devices)


def solve_bound(table: _Table, t_max: float, combine: str = "sum") -> list[Stage] | None:
    """Alpa's recurrence under `t_max`: the least-sum plan (or least-max, `combine="max"`).

    Vectorised over stage counts, next-stage starts and device counts; loops over the first
    layer and the submesh. Only values are kept; the plan is recovered by recomputing the
    few states on its path.
    """
    best, sizes, devices = table.best, table.sizes, table.num_devices
    rows, num_layers = best.shape[0], best.shape[1]
    off = devices  # device axis offset so that `d - devices(m) < 0` reads inf
    width = off + devices + 1
    # f[r]: r stages (row `rows` = every count >= rows); prev[r] feeds target row r + 1:
    # prev[r] = f[r] except prev[rows - 1] = min(f[rows - 1], f[rows]).
    f = np.full((rows + 1, num_layers + 1, width), np.inf)
    f[0, num_layers, off] = 0.0
    prev = np.full((rows, num_layers + 1, width), np.inf)
    prev[0, num_layers, off] = 0.0
    op = np.add if combine == "sum" else np.maximum
    allowed = np.where(best <= t_max, best, np.inf)
    finite: NDArray[np.bool_] = np.isfinite(allowed)
    # Per (first layer, submesh): how many memory rows and which ends have a usable stage.
    row_count = finite.any(axis=2).sum(axis=0)  # [i, m]; rows are nested, so a count
    ends = np.asarray(finite.any(axis=0))  # [i, e, m]
    first_end = ends.argmax(axis=1)
    last_end = num_layers - 1 - ends[:, ::-1, :].argmax(axis=1)
    buf = np.empty((rows, num_layers, devices + 1))
    low = np.empty((rows, devices + 1))
    for i in range(num_layers - 1, -1, -1):
        nr = min(rows, num_layers - i)  # at most L - i stages start at layer i
        top = np.full((nr, devices + 1), np.inf)
        for sub in np.flatnonzero(row_count[i]).tolist():
            n, use = int(sizes[sub]), min(nr, int(row_count[i, sub]))
            e0, e1 = int(first_end[i, sub]), int(last_end[i, sub]) + 1
            cand = buf[:use, : e1 - e0]
            g = allowed[:use, i, e0:e1, sub, None]  # ends e0.. <-> next starts e0 + 1..
            op(prev[:use, e0 + 1 : e1 + 1, off - n : off - n + devices + 1], g, out=cand)
            np.minimum(top[:use], cand.min(axis=1, out=low[:use]), out=top[:use])
        f[1 : nr + 1, i, off:] = top
        prev[: rows - 1, i] = f[: rows - 1, i]
        prev[rows - 1, i] = np.minimum(f[rows - 1, i], f[rows, i])
    final = f[1:, 0, off + devices]
    if not np.isfinite(final).any():
        return None
    r, i, d = int(final.argmin()) + 1, 0, devices
    stages: list[Stage] = []
    while i < num_layers:
        # the (next start, submesh) that produced f[r, i, d], recomputed as in the loop
        before = prev[r - 1][i + 1 :, np.maximum(off + d - sizes, 0)]  # [L - i, S]
        values = op(before, allowed[r - 1, i, i:, :])
        flat = int(values.argmin())
        k, m = i + 1 + flat // values.shape[1], flat % values.shape[1]
        if values.flat[flat] != f[r, i, off + d]:
            raise AssertionError(f"DP backtrack lost the optimum at layer {i}")
        stages.append((i, k - 1, m, int(table.arg[r - 1, i, k - 1, m])))
        d -= int(sizes[m])
        if r == rows and f[rows, k, off + d] < f[rows - 1, k, off + d]:
            r = rows  # the bucket row ">= rows stages" fed itself
        else:
            r -= 1
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
    walk = _BoundSearch(table, num_microbatches)
    walk.run()
    logger.debug("training_dp: %d bounds solved, cost %s", walk.solved, walk.best_cost)
    return DPResult(cost=walk.best_cost, stages=walk.best_stages, num_bounds_solved=walk.solved)


class _BoundSearch:
    """The walk over the bounds `t_max` (the distinct stage costs, `values`), top down.

    Solving at `t` gives a plan with least sum `S` and largest stage `M <= t`; every bound in
    `[M, t]` has that least sum, so the walk goes on below `M`. A plan whose largest stage is
    `v` and that lies below a solved bound costs at least `S + (B-1) * v` and at least
    `B * v` (Alpa's stop rule), so only bounds `v` under both limits are worth solving; and
    none lies below the least largest stage of any plan (one max-plus solve).
    """

    def __init__(self, table: _Table, num_microbatches: int) -> None:
        self.table = table
        self.micro = num_microbatches
        self.values = np.unique(table.best[np.isfinite(table.best)])
        self.best_cost = math.inf
        self.best_stages: list[Stage] = []
        self.solved = 0

    def solve(self, t_max: float, combine: str = "sum") -> tuple[float, float] | None:
        """Solve one bound; keep its plan if best; return (sum, max) of the plan or None."""
        stages = solve_bound(self.table, t_max, combine)
        self.solved += 1
        if stages is None:
            return None
        costs = stage_costs(self.table.cost, stages)
        value = pipeline_cost(costs, self.micro)
        if value < self.best_cost:
            self.best_cost, self.best_stages = value, stages
        return sum(costs), max(costs)

    def promising(self, least_sum: float) -> int:
        """Index of the largest bound `v` with `least_sum + (B-1) v` and `B v` below the best."""
        b, best = self.micro, self.best_cost
        limit = best / b if b == 1 else min(best / b, (best - least_sum) / (b - 1))
        idx = int(np.searchsorted(self.values, limit, side="right")) - 1
        while idx >= 0:
            v = float(self.values[idx])
            if least_sum + (b - 1) * v < best and b * v < best:
                break
            idx -= 1
        return idx

    def run(self) -> None:
        top = self.solve(math.inf)
        if top is None:
            return
        least_sum, largest = top
        hi = int(np.searchsorted(self.values, largest, side="left")) - 1
        lo = -1  # unknown until the max-plus solve
        while True:
            hi = min(hi, self.promising(least_sum))
            if hi < max(lo, 0):
                return
            if lo < 0:
                floor = self.solve(math.inf, combine="max")
                if floor is None:
                    raise AssertionError("a plan exists but the max-plus solve found none")
                lo = int(np.searchsorted(self.values, floor[1], side="left"))
                continue
            found = self.solve(float(self.values[hi]))
            if found is None:
                return
            least_sum, largest = found
            hi = min(hi, int(np.searchsorted(self.values, largest, side="left"))) - 1


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
