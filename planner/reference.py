"""Yardsticks for the fast DP, for benchmarks and cross-checks only.

`training_dp_loops`: Alpa's `training_dp`, transcribed as plain Python loops. Same
recurrence and the same bound walk as Alpa's: every distinct stage cost as `t_max`, in
increasing order, stopping once `B * t_max` reaches the best objective and skipping a bound
closer than `gap` to the last one solved. Slow (five nested loops per bound).

`runner_up_by_exclusion`: the runner-up as the best, over the chosen plan's stages, of the
DP with that stage made infeasible (one whole DP per stage; `runner_up_dp` needs one walk).
"""

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from numpy.typing import ArrayLike

from planner.dp import DPResult, _BoundSearch, _first_of_best, pipeline_cost
from planner.dp_inputs import _prepare, _reduce, _Table, validate_inputs
from planner.ranks import Stage, SubmeshLike

ALPA_GAP = 1e-6


def solve_bound_loops(
    cost: list[list[list[list[float]]]],
    mns: list[list[list[list[int]]]],
    sizes: Sequence[int],
    num_devices: int,
    t_max: float,
) -> list[Stage] | None:
    """Alpa's `training_dp_impl` for one bound: the least-sum plan, or None."""
    num_layers = len(cost)
    inf = math.inf
    f = [[[inf] * (num_devices + 1) for _ in range(num_layers + 1)] for _ in range(num_layers + 1)]
    arg: list[list[list[tuple[int, int, int] | None]]] = [
        [[None] * (num_devices + 1) for _ in range(num_layers + 1)] for _ in range(num_layers + 1)
    ]
    f[0][num_layers][0] = 0.0
    for s in range(1, num_layers + 1):
        for i in range(num_layers - 1, -1, -1):
            for j in range(1, num_devices + 1):
                for k in range(num_layers, i, -1):
                    row_cost, row_mns = cost[i][k - 1], mns[i][k - 1]
                    for m, n in enumerate(sizes):
                        if n > j:
                            continue
                        before = f[s - 1][k][j - n]
                        for c, stage_cost in enumerate(row_cost[m]):
                            if s - 1 <= row_mns[m][c] and stage_cost <= t_max:
                                new = before + stage_cost
                                if new < f[s][i][j]:
                                    f[s][i][j] = new
                                    arg[s][i][j] = (k, m, c)
    best_s = min(range(1, num_layers + 1), key=lambda s: f[s][0][num_devices])
    if math.isinf(f[best_s][0][num_devices]):
        return None
    stages: list[Stage] = []
    s, i, j = best_s, 0, num_devices
    while s > 0:
        step = arg[s][i][j]
        if step is None:
            raise AssertionError("broken backtrack")
        k, m, c = step
        stages.append((i, k - 1, m, c))
        s, i, j = s - 1, k, j - sizes[m]
    return stages


def training_dp_loops(
    compute_cost: ArrayLike,
    max_n_succ_stages: ArrayLike | None,
    submesh_choices: Sequence[SubmeshLike],
    num_devices: int,
    num_microbatches: int,
    gap: float = ALPA_GAP,
) -> DPResult:
    """Alpa's training DP in plain loops (same arguments and result as `training_dp`)."""
    cost_arr, mns_arr, sizes = validate_inputs(
        compute_cost, max_n_succ_stages, submesh_choices, num_devices
    )
    cost, mns = cost_arr.tolist(), mns_arr.tolist()
    size_list = [int(n) for n in sizes]
    bounds = np.unique(cost_arr[np.isfinite(cost_arr)])
    best_cost, best_stages, solved, last = math.inf, [], 0, 0.0
    for t_max in bounds.tolist():
        if t_max * num_microbatches >= best_cost:
            break
        if t_max - last < gap:
            continue
        stages = solve_bound_loops(cost, mns, size_list, num_devices, t_max)
        solved += 1
        if stages is not None:
            value = pipeline_cost([cost[a][b][m][c] for a, b, m, c in stages], num_microbatches)
            if value < best_cost:
                best_cost, best_stages = value, stages
        last = t_max
    return DPResult(cost=best_cost, stages=best_stages, num_bounds_solved=solved)


def without_stage(table: _Table, stage: Stage) -> _Table:
    """The same table with one stage `(start, end, submesh, config)` made infeasible."""
    start, end, m, c = stage
    cost = table.cost.copy()
    cost[start, end, m, c] = np.inf
    level = table.level.copy()
    level[start, end, m, c] = -1
    rows = table.best.shape[0]
    best, arg = table.best.copy(), table.arg.copy()
    block = (slice(start, start + 1), slice(end, end + 1))
    best[:, *block], arg[:, *block] = _reduce(cost[block], level[block], rows, table.cfg_rank)
    return replace(table, cost=cost, best=best, arg=arg, level=level)


def runner_up_by_exclusion(
    compute_cost: ArrayLike,
    max_n_succ_stages: ArrayLike | None,
    submesh_choices: Sequence[SubmeshLike],
    num_devices: int,
    num_microbatches: int,
    chosen: Sequence[Stage],
    config_rank: ArrayLike | None = None,
) -> DPResult:
    """Same answer as `runner_up_dp`: every other plan lacks a stage of `chosen`."""
    table = _prepare(compute_cost, max_n_succ_stages, submesh_choices, num_devices, config_rank)
    found: list[tuple[float, list[Stage]]] = []
    solved = 0
    for stage in dict.fromkeys(chosen):
        walk = _BoundSearch(without_stage(table, stage), num_microbatches)
        walk.run()
        solved += walk.solved
        cost, stages = walk.result()
        if math.isfinite(cost):
            found.append((cost, stages))
    cost, stages = _first_of_best(table, found)
    return DPResult(cost=cost, stages=stages, num_bounds_solved=solved)
