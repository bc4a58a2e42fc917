"""An exact stage DP for objectives `Σ a + w · max b` (the schedules' closed forms).

`a[i, e, k]` is what a stage over layers `i..e` with choice `k` (a submesh and a config) adds
to the sum, `b[i, e, k]` what it puts under the max; `w` weighs the max. 1F1B and GPipe have
`a = b = F + B` and `w = B - 1` (Alpa's objective); ZB-H1 `a = F + B` (its critical path),
`b = F + B + W`; interleaved `a = t / v`, `b = t` and `w = v B - 1` over its chunks.

A stage is allowed by the schedule's memory rule, which may depend on how many stages follow
it (`allow[q, i, e, k]`, the last row standing for every `q` at or past it). The walk over
the bounds `t` on the max is the one of `planner.dp`: solving at `t` gives the least sum `S`
under `t` and a plan whose largest `b` is `M <= t`, which beats every plan whose largest `b`
lies in `[M, t]`; the next bound is the largest value below `M`; the walk stops once `S` plus
`w` times the least largest `b` of any plan (one max-plus solve) reaches the best objective.
Every plan the walk solves is kept (`found`): they are the proposals the simulator re-ranks.
"""

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

Stage = tuple[int, int, int]  # (start, end inclusive, choice)
ANY_COUNT = 0


@dataclass
class SumMaxResult:
    """The best objective and plan, and every plan the walk solved (objective, stages)."""

    cost: float = math.inf
    stages: list[Stage] = field(default_factory=list)
    found: list[tuple[float, list[Stage]]] = field(default_factory=list)
    num_bounds_solved: int = 0

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.cost)


def objective(a: NDArray[np.float64], b: NDArray[np.float64], plan: list[Stage], w: float) -> float:
    """`Σ a + w · max b` of a plan, summed first stage first."""
    return float(sum(float(a[s]) for s in plan) + w * max(float(b[s]) for s in plan))


class _Solver:
    def __init__(
        self,
        a: NDArray[np.float64],
        b: NDArray[np.float64],
        allow: NDArray[np.bool_],
        sizes: NDArray[np.int64],
        num_devices: int,
        num_stages: int,
    ) -> None:
        self.a, self.b, self.allow, self.sizes = a, b, allow, sizes
        self.devices, self.exact = num_devices, num_stages
        self.num_layers = a.shape[0]
        self.rows = num_stages if num_stages else allow.shape[0]

    def solve(self, t_max: float, combine: str = "sum") -> list[Stage] | None:
        """Least-sum plan (or least-max of `b`) with every `b <= t_max`, or None."""
        n, rows, width = self.num_layers, self.rows, self.devices + 1
        usable = np.isfinite(self.a) & (self.b <= t_max)
        value = self.a if combine == "sum" else self.b
        # g[r, i, d]: r stages cover layers i.. on d devices (r = rows: at least rows when
        # the count is free); prev[r] feeds a stage taken with r stages in all.
        g = np.full((rows + 1, n + 1, width), np.inf)
        g[0, n, 0] = 0.0
        prev = np.full((rows + 1, n + 1, width), np.inf)
        prev[1, n, 0] = 0.0
        from_bucket = np.zeros((n + 1, width), dtype=bool)
        choice = np.full((rows + 1, n, width, 2), -1, dtype=np.int64)
        op = np.add if combine == "sum" else np.maximum
        for i in range(n - 1, -1, -1):
            top = min(rows, n - i)
            best = np.full((top, width), np.inf)
            arg = np.full((top, width, 2), -1, dtype=np.int64)
            for k in np.flatnonzero(usable[i].any(axis=0)).tolist():
                size = int(self.sizes[k])
                if size > self.devices:
                    continue
                ends = np.flatnonzero(usable[i, :, k])
                mask = self._allowed(i, ends, k, top)  # [top, len(ends)]
                shifted = np.full((top, ends.size, width), np.inf)
                shifted[:, :, size:] = prev[1 : top + 1][:, ends + 1, : width - size]
                cand = op(shifted, value[i, ends, k][None, :, None])
                cand[~mask] = np.inf
                j = cand.argmin(axis=1)  # [top, width]
                low = np.take_along_axis(cand, j[:, None, :], axis=1)[:, 0, :]
                better = low < best
                best = np.where(better, low, best)
                arg[..., 0] = np.where(better, ends[j], arg[..., 0])
                arg[..., 1] = np.where(better, k, arg[..., 1])
            g[1 : top + 1, i] = best
            choice[1 : top + 1, i] = arg
            prev[2 : rows + 1, i] = g[1:rows, i]
            if not self.exact:
                from_bucket[i] = g[rows, i] < g[rows - 1, i]
                prev[rows, i] = np.minimum(g[rows - 1, i], g[rows, i])
        return self._backtrack(g, choice, from_bucket)

    def _allowed(self, i: int, ends: NDArray[np.int64], k: int, top: int) -> NDArray[np.bool_]:
        """`[r - 1, e]`: whether the stage may be taken with r stages in all (r - 1 follow)."""
        rules = self.allow[:, i, ends, k]  # [Q, len(ends)]
        return rules[np.minimum(np.arange(top), rules.shape[0] - 1)]

    def _backtrack(
        self,
        g: NDArray[np.float64],
        choice: NDArray[np.int64],
        from_bucket: NDArray[np.bool_],
    ) -> list[Stage] | None:
        final = g[1:, 0, self.devices]
        if self.exact:
            r = self.rows
            if not math.isfinite(final[r - 1]):
                return None
        else:
            if not np.isfinite(final).any():
                return None
            r = int(np.argmin(final)) + 1
        stages: list[Stage] = []
        i, d = 0, self.devices
        while i < self.num_layers:
            e, k = (int(x) for x in choice[r, i, d])
            stages.append((i, e, k))
            i, d = e + 1, d - int(self.sizes[k])
            stay = r == self.rows and not self.exact and i < self.num_layers and from_bucket[i, d]
            r = r if stay else r - 1
        return stages


def sum_max_dp(
    a: NDArray[np.float64],
    b: NDArray[np.float64],
    allow: NDArray[np.bool_],
    sizes: NDArray[np.int64],
    num_devices: int,
    weight: float,
    num_stages: int = ANY_COUNT,
    ceiling: float = math.inf,
) -> SumMaxResult:
    """Plans minimising `Σ a + weight · max b` on exactly `num_devices` (see the module).

    `a`, `b`: `[L, L, K]` (inf: unusable); `allow`: `[Q, L, L, K]`, whether a stage may have
    `q` stages after it (row `Q - 1`: `q >= Q - 1`); `sizes[k]`: devices of choice `k`.
    `num_stages`: exactly that many stages (then `allow[q]` is the rule of the stage with `q`
    after it, `Q = num_stages`); 0: any number. `ceiling`: an objective known to be reachable
    elsewhere (the walk stops once it cannot beat it; the plans it found are still kept).
    """
    if a.shape != b.shape or a.ndim != 3 or allow.shape[1:] != a.shape:
        raise ValueError(f"a {a.shape}, b {b.shape}, allow {allow.shape} do not match")
    if num_stages and allow.shape[0] != num_stages:
        raise ValueError(f"allow needs {num_stages} rows for {num_stages} stages")
    solver = _Solver(a, b, allow, sizes, num_devices, num_stages)
    out = SumMaxResult()
    values = np.unique(b[np.isfinite(a) & np.isfinite(b)])

    def keep(plan: list[Stage]) -> tuple[float, float]:
        out.num_bounds_solved += 1
        value = objective(a, b, plan, weight)
        if all(p != plan for _, p in out.found):
            out.found.append((value, plan))
        return sum(float(a[s]) for s in plan), max(float(b[s]) for s in plan)

    plan = solver.solve(math.inf)
    if plan is None:
        out.num_bounds_solved = 1
        return out
    least_sum, largest = keep(plan)
    floor_plan = solver.solve(math.inf, combine="max")
    floor = max(float(b[s]) for s in floor_plan) if floor_plan else largest
    while True:
        best = min(ceiling, *(v for v, _ in out.found))
        if least_sum + weight * floor >= best:
            break
        idx = int(np.searchsorted(values, largest, side="left")) - 1
        if idx < 0 or values[idx] < floor:
            break
        plan = solver.solve(float(values[idx]))
        if plan is None:
            break
        least_sum, largest = keep(plan)
    out.found.sort(key=lambda t: t[0])
    out.cost, out.stages = out.found[0]
    return out
