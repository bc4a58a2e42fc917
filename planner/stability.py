"""How sure the planner is of its plan: the runner-up's gap against the measured spread."""

from collections.abc import Sequence

from planner.dp import pipeline_cost
from planner.table import CostTable, Key
from schemas import Stability


def plan_cost_spread(table: CostTable, keys: Sequence[Key], num_microbatches: int) -> float:
    """Relative measured spread of a plan's DP objective `Σt + (B-1)·max t`.

    Each stage adds its measured forward + backward time times its relative spread
    (`StageProfileResult.compute_cost_spread`, (p90 - p10) / median of the timed runs),
    weighted as the objective weighs it: B for the largest stage (the first of equal ones),
    1 for the others; the sum is divided by the objective. Transfer time is a model, not a
    measurement, so it adds nothing to the spread (but counts in the objective).
    """
    times = [float(table.dp_cost[k]) for k in keys]
    if not times:
        return 0.0
    objective = pipeline_cost(times, num_microbatches)
    if objective <= 0:
        return 0.0
    largest = times.index(max(times))
    spread = 0.0
    for p, key in enumerate(keys):
        result = table.results[key]
        weight = num_microbatches if p == largest else 1
        spread += weight * result.compute_cost * result.compute_cost_spread
    return spread / objective


def relative_gap(best: float, runner_up: float) -> float | None:
    """`(runner_up - best) / best`, at least 0 (ties within rounding give 0); None if best is 0."""
    if best <= 0:
        return None
    return max(0.0, (runner_up - best) / best)


def assess(best: float, runner_up: float | None, noise: float) -> Stability:
    """'unique' without a runner-up; 'stable' when it is slower than the plan by more than the
    relative spread `noise`; else 'within_noise'."""
    if runner_up is None:
        return "unique"
    return "stable" if runner_up - best > noise * best else "within_noise"
