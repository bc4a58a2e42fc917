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

Ties. Plans whose objectives agree within a relative `REL_TIE` (1e-12, which absorbs the
rounding of sums taken in different orders) are tied, and the DP returns the first of them
in this total order (`plan_order_key`), which depends only on what the stages are, never on
the order in which submeshes or configs were given:

1. fewer stages first;
2. then the stage sequences compared lexicographically, first stage first, each stage by
   `(start, end, submesh rank, config rank)`. The submesh rank orders submeshes by their shape
   `(hosts, devices_per_host)` (equal shapes: by index); the config rank is the caller's
   `config_rank[submesh, config]` (default: the config index), e.g. by logical mesh and
   strategy, as `planner.plan.config_ranks` does.

Inside a bound the values are as before; the backtrack (`_Backtrack`) takes at each state
the first near-optimal stage in this order (a state below the bucket row has a fixed number
of stages left, so only the bucket row needs stage counts, found on demand), which gives
the first least-sum plan in the order; configs of equal cost are reduced to the lowest
rank. The bound walk keeps every plan it solved, also visits the bounds that may hold a
tied plan, and returns the first of the tied ones. Costs: the same solves as before plus a
few small ones on the plan's path.

Runner-up (`planner.runner_up.runner_up_dp`): the best plan other than the chosen one, in
the same order, found by the same bound walk with one solve per bound (see that module).

Modules: `planner.ranks` (the tie order), `planner.dp_inputs` (checking the inputs and
reducing them over configs), `planner.recurrence` (one bound: `_forward`, `_Backtrack`),
this one (the bound walk, `training_dp`, `inference_dp`) and `planner.runner_up`.
"""

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from planner.dp_inputs import _prepare, _Table
from planner.ranks import Stage, SubmeshLike, _tie_limit
from planner.recurrence import solve_bound

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DPResult:
    """A DP answer: `cost` (inf when no plan exists) and `stages` as
    `(start, end_inclusive, submesh_id, config_id)`, first stage first."""

    cost: float
    stages: list[Stage] = field(default_factory=list)
    num_bounds_solved: int = 0
    table: _Table | None = field(default=None, repr=False, compare=False)  # the reduced table

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.cost)


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
    config_rank: ArrayLike | None = None,
) -> DPResult:
    """Pipeline stages minimising `sum(t) + (B-1) * max(t)` on exactly `num_devices`.

    `compute_cost`, `max_n_succ_stages`: shape `[L, L, S, C]` indexed
    `[start, end_inclusive, submesh, config]`; inf cost = infeasible or missing; a stage
    with `s` stages after it needs `s <= max_n_succ_stages` (None: no memory limit).
    `config_rank[submesh, config]` (shape `[S, C]`, any sortable numbers): the configs' order
    for ties (default: their index); see the module docstring for the whole tie order.
    Returns `DPResult(cost=inf, stages=[])` when no plan exists; ValueError on NaN.
    """
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    table = _prepare(compute_cost, max_n_succ_stages, submesh_choices, num_devices, config_rank)
    walk = _BoundSearch(table, num_microbatches)
    walk.run()
    cost, stages = walk.result()
    logger.debug("training_dp: %d bounds solved, cost %s", walk.solved, cost)
    return DPResult(
        cost=cost,
        stages=stages,
        num_bounds_solved=walk.solved,
        table=table,
    )


def _first_of_best(
    table: _Table, found: Sequence[tuple[float, list[Stage]]]
) -> tuple[float, list[Stage]]:
    """The least objective, and among the plans tied with it the first in the tie order."""
    if not found:
        return math.inf, []
    limit = _tie_limit(min(cost for cost, _ in found))
    tied = [(table.order_key(stages), cost, stages) for cost, stages in found if cost <= limit]
    _, cost, stages = min(tied, key=lambda t: t[0])
    return cost, stages


class _BoundSearch:
    """The walk over the bounds `t_max` (the distinct stage costs, `values`), top down.

    Solving at `t` gives a plan with least sum `S` and largest stage `M <= t`; every bound in
    `[M, t]` has that least sum, so the walk goes on below `M`. A plan whose largest stage is
    `v` and that lies below a solved bound costs at least `S + (B-1) * v` and at least
    `B * v` (Alpa's stop rule), so only bounds `v` under both limits (or tied with the best,
    for the tie order) are worth solving; and none lies below the least largest stage of
    any plan (one max-plus solve). With B = 1 the objective is the sum and the first solve
    holds every optimal plan. `ceiling`: an objective known to be reachable (prunes more).
    Subclasses may solve each bound differently (`plan_at`) and keep only some plans
    (`keeps`), as `planner.runner_up` does.
    """

    def __init__(
        self,
        table: _Table,
        num_microbatches: int,
        ceiling: float = math.inf,
    ) -> None:
        self.table = table
        self.micro = num_microbatches
        self.values = np.unique(table.best[np.isfinite(table.best)])
        self.best_cost = ceiling
        self.found: list[tuple[float, list[Stage]]] = []
        self.solved = 0

    def plan_at(self, t_max: float, combine: str = "sum") -> list[Stage] | None:
        """The plan the walk takes from bound `t_max` (`solve_bound`), or None."""
        return solve_bound(self.table, t_max, combine)

    def keeps(self, stages: list[Stage]) -> bool:
        """Whether a solved plan counts as found (here: every one)."""
        return True

    def solve(self, t_max: float, combine: str = "sum") -> tuple[float, float] | None:
        """Solve one bound; keep its plan; return (sum, max) of the plan or None."""
        stages = self.plan_at(t_max, combine)
        self.solved += 1
        if stages is None:
            return None
        costs = stage_costs(self.table.cost, stages)
        if self.keeps(stages):
            value = pipeline_cost(costs, self.micro)
            self.found.append((value, stages))
            self.best_cost = min(self.best_cost, value)
        return sum(costs), max(costs)

    def result(self) -> tuple[float, list[Stage]]:
        return _first_of_best(self.table, self.found)

    def promising(self, least_sum: float) -> int:
        """Index of the largest bound `v` with `least_sum + (B-1) v` and `B v` below the best
        (B > 1: or tied with it)."""
        b = self.micro
        if b == 1:
            return -1
        best = _tie_limit(self.best_cost)
        limit = min(best / b, (best - least_sum) / (b - 1))
        limit += 1e-9 * abs(limit)  # the divisions round; the loop below checks exactly
        idx = int(np.searchsorted(self.values, limit, side="right")) - 1
        while idx >= 0:
            v = float(self.values[idx])
            if least_sum + (b - 1) * v <= best and b * v <= best:
                break
            idx -= 1
        return idx

    def run(self) -> None:
        """Walk the bounds; the plans kept are in `found` (the answer: `result`)."""
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
    config_rank: ArrayLike | None = None,
) -> DPResult:
    """Pipeline stages minimising the largest stage time (a pipeline's throughput bound).

    Same inputs as `training_dp`; nothing is stashed for a backward pass, so the 1F1B rule
    does not apply and only `max_n_succ_stages < 0` (does not fit at all) excludes a
    candidate. Among plans with the least largest stage it returns one with the least sum
    (ties: the first in `training_dp`'s tie order). `cost` is the largest stage time.
    (Alpa's `inference_dp` multiplies it by the stage count.)
    """
    table = _prepare(
        compute_cost, max_n_succ_stages, submesh_choices, num_devices, config_rank, False
    )
    bottleneck = solve_bound(table, math.inf, combine="max")
    if bottleneck is None:
        return DPResult(cost=math.inf, stages=[], num_bounds_solved=1)
    t_max = max(stage_costs(table.cost, bottleneck))
    stages = solve_bound(table, t_max) or bottleneck
    return DPResult(cost=max(stage_costs(table.cost, stages)), stages=stages, num_bounds_solved=2)
