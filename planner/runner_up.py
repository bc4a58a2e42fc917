"""Runner-up (`runner_up_dp`): the best plan other than the chosen one, under `training_dp`'s
objective and tie order (see `planner.dp`).

Any other plan leaves the chosen plan's path through the recurrence's states at a first
point: another first row (stage count), another (end, submesh) or config at a state, or in
the bucket row the other successor row; from there it is best continued optimally. So each
bound needs one solve and a look at the chosen plan's states (`solve_bound_other`), and
the same bound walk finds the runner-up in about the time of the DP itself. (Equivalently,
and checked against it in the tests: the best over the chosen stages of the DP without
that stage, `planner.reference.runner_up_by_exclusion`, one whole DP per stage.)
"""

import logging
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from planner.dp import DPResult, _BoundSearch, stage_costs
from planner.dp_inputs import _prepare, _Table
from planner.ranks import Stage, SubmeshLike, _tie_limit
from planner.recurrence import _Backtrack, _forward, solve_bound

logger = logging.getLogger(__name__)


def runner_up_dp(
    compute_cost: ArrayLike,
    max_n_succ_stages: ArrayLike | None,
    submesh_choices: Sequence[SubmeshLike],
    num_devices: int,
    num_microbatches: int,
    chosen: DPResult | Sequence[Stage],
    config_rank: ArrayLike | None = None,
) -> DPResult:
    """The best plan other than `chosen` under `training_dp`'s objective and tie order.

    Same arguments as `training_dp`; `chosen` is a plan's stages, or `training_dp`'s result
    on the same inputs (whose reduced table is then reused). The same walk over the bounds
    as `training_dp`, each bound solved for the least-sum plan other than `chosen`
    (`solve_bound_other`). Returns `DPResult(cost=inf, stages=[])` when no other plan exists.
    """
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    given = chosen.table if isinstance(chosen, DPResult) else None
    table = given or _prepare(
        compute_cost, max_n_succ_stages, submesh_choices, num_devices, config_rank
    )
    stages_of = chosen.stages if isinstance(chosen, DPResult) else chosen
    walk = _RunnerUpSearch(table, num_microbatches, [_as_stage(s) for s in stages_of])
    walk.run()
    cost, stages = walk.result()
    logger.debug("runner_up_dp: %d bounds solved, cost %s", walk.solved, cost)
    return DPResult(cost=cost, stages=stages, num_bounds_solved=walk.solved)


def _as_stage(stage: Sequence[int]) -> Stage:
    start, end, m, c = (int(x) for x in stage)
    return (start, end, m, c)


class _RunnerUpSearch(_BoundSearch):
    """`training_dp`'s bound walk over the plans other than `other_than`: each bound solved
    by `solve_bound_other` (the max-plus solve, a lower bound, may still return
    `other_than`; it is then not kept)."""

    def __init__(self, table: _Table, num_microbatches: int, other_than: list[Stage]) -> None:
        super().__init__(table, num_microbatches)
        self.other_than = other_than

    def plan_at(self, t_max: float, combine: str = "sum") -> list[Stage] | None:
        if combine == "sum":
            return solve_bound_other(self.table, t_max, self.other_than)
        return super().plan_at(t_max, combine)

    def keeps(self, stages: list[Stage]) -> bool:
        return stages != self.other_than

    def run(self) -> None:
        if self.other_than:
            # Plans close to the excluded one are likely close to it in cost: the bound of
            # its largest stage gives a good first best, which prunes the walk.
            self.solve(max(stage_costs(self.table.cost, self.other_than)))
        super().run()


def solve_bound_other(table: _Table, t_max: float, plan: Sequence[Stage]) -> list[Stage] | None:
    """The least-sum plan under `t_max` other than `plan`; among those within `REL_TIE` of it,
    the first in the tie order. None when no other plan exists.

    A plan other than `plan` starts in another row, or leaves `plan`'s path at some state
    for good: by another (end, submesh), by the same one with another config, or (in the
    bucket row) by the same stage into the other successor row; and then goes on optimally.
    One solve of the recurrence gives every such value; the least ones are rebuilt.
    """
    if not plan or not _on_table(table, plan, t_max):
        return solve_bound(table, t_max)  # every plan under t_max is another plan
    bt = _forward(table, t_max)
    rows, sizes, off = bt.rows, table.sizes, bt.off
    path_rows = [*_plan_rows(plan, rows), 0]
    final = bt.f[1:, 0, off + table.num_devices]
    # (value, how to build it): ("root", r) | ("config", j, c) | ("successor", j, row);
    # leaving by another (end, submesh) at stage j: edges[j] = values over [end - i, submesh]
    options: list[tuple[float, tuple[int | str, ...]]] = [
        (float(final[r - 1]), ("root", r))
        for r in range(1, rows + 1)
        if r != path_rows[0] and math.isfinite(final[r - 1])
    ]
    edges: list[NDArray[np.float64]] = []
    prefix, d = 0.0, table.num_devices
    for j, (i, e, m, c) in enumerate(plan):
        r, after = path_rows[j], d - int(sizes[m])
        before = bt.prev[r - 1][i + 1 :, np.maximum(off + d - sizes, 0)]  # [L - i, S]
        values = prefix + (before + bt.allowed[r - 1, i, i:, :])
        values[e - i, m] = np.inf
        edges.append(values)
        rest = float(bt.prev[r - 1][e + 1, off + after])
        for c2 in _other_configs(table, (i, e, m, c), r - 1, t_max):
            options.append((prefix + float(table.cost[i, e, m, c2]) + rest, ("config", j, c2)))
        cost = float(table.cost[i, e, m, c])
        if r == rows:
            other = rows - 1 if path_rows[j + 1] == rows else rows
            alt = float(bt.f[other, e + 1, off + after])
            if math.isfinite(alt):
                options.append((prefix + cost + alt, ("successor", j, other)))
        prefix += cost
        d = after
    least = min([v for v, _ in options] + [float(v.min()) for v in edges])
    if not math.isfinite(least):
        return None
    limit = _tie_limit(least)
    near = [how for v, how in options if v <= limit]
    for j, values in enumerate(edges):
        for x, y in zip(*np.nonzero(values <= limit), strict=True):
            near.append(("edge", j, int(x) + plan[j][0], int(y)))
    built = [_rebuild(bt, plan, path_rows, how) for how in near]
    return min(built, key=table.order_key)


def _plan_rows(plan: Sequence[Stage], rows: int) -> list[int]:
    """The row of the state before each stage of a plan: its stages left, or the bucket."""
    return [min(len(plan) - j, rows) for j in range(len(plan))]


def _on_table(table: _Table, plan: Sequence[Stage], t_max: float) -> bool:
    """Whether the plan is a path of the recurrence under `t_max` (cost and memory rule)."""
    rows = table.best.shape[0]
    for stage, r in zip(plan, _plan_rows(plan, rows), strict=True):
        cost = float(table.cost[stage])
        if not (math.isfinite(cost) and cost <= t_max and table.level[stage] >= r - 1):
            return False
    return True


def _other_configs(table: _Table, stage: Stage, row: int, t_max: float) -> list[int]:
    """The cheapest configs other than the stage's own of its (start, end, submesh), allowed
    at memory row `row` under `t_max` (all of equal cost)."""
    i, e, m, c = stage
    costs = np.where(table.level[i, e, m] >= row, table.cost[i, e, m], np.inf)
    costs[c] = np.inf
    costs[costs > t_max] = np.inf
    if not np.isfinite(costs).any():
        return []
    return np.flatnonzero(costs == costs.min()).tolist()


def _rebuild(
    bt: _Backtrack, plan: Sequence[Stage], path_rows: list[int], how: tuple[int | str, ...]
) -> list[Stage]:
    """The plan an option of `solve_bound_other` stands for."""
    kind, j = how[0], int(how[1])
    if kind == "root":
        return bt.path(j)
    i, e, m, c = plan[j]
    r, d = path_rows[j], bt.table.num_devices - sum(int(bt.sizes[s[2]]) for s in plan[:j])
    if kind == "edge":
        e, m = int(how[2]), int(how[3])
        c = int(bt.table.arg[r - 1, i, e, m])
    elif kind == "config":
        c = int(how[2])
    after = d - int(bt.sizes[m])
    row = int(how[2]) if kind == "successor" else bt.successor_row(r, e + 1, after)
    return [*plan[:j], (i, e, m, c), *bt.path(row, e + 1, after)]
