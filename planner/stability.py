"""How sure the planner is of its plan: the runner-up's gap against the measured spread.

The runner-up is the best plan other than the chosen one under any schedule searched, the
baselines (1F1B plans) included where 1F1B is searched (`runner_up_among`): another plan has
other stages, or the same stages under another schedule (or another number of chunks)."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.dp import pipeline_cost
from planner.search import Proposal, ScheduleSearch, schedule_memory, simulate_keys
from planner.table import CostTable, Key
from schemas import BaselinePlan, Stability


@dataclass(frozen=True)
class OtherPlan:
    """A plan beside the chosen one: its schedule, as simulated, and the baseline it is."""

    schedule: str
    proposal: Proposal
    baseline: str | None = None

    @property
    def identity(self) -> tuple[str, int, tuple[Key, ...]]:
        return (self.schedule, self.proposal.virtual_stages, tuple(self.proposal.keys))


def baseline_proposal(table: CostTable, base: BaselinePlan, micro: int) -> OtherPlan | None:
    """A feasible baseline as a 1F1B plan (how baselines are simulated); None otherwise."""
    if base.iteration_time_s is None or not base.stages:
        return None
    keys: list[Key] = [(s.start, s.end, s.submesh_id, s.config_id) for s in base.stages]
    sched = simulate_keys(table, "1f1b", keys, micro, len(keys))
    memory, fits = schedule_memory(table, "1f1b", keys, sched, len(keys))
    if not fits:
        return None
    proxy = pipeline_cost([float(table.dp_cost[k]) for k in keys], micro)
    return OtherPlan("1f1b", Proposal(keys, proxy, 1, len(keys), sched, memory, fits), base.name)


def runner_up_among(
    table: CostTable,
    searches: Sequence[ScheduleSearch],
    chosen: OtherPlan,
    baselines: Sequence[BaselinePlan],
    micro: int,
) -> OtherPlan | None:
    """The fastest plan other than `chosen` in simulated time: every schedule's ranked
    proposals and, where 1F1B is searched, every feasible baseline (ties: the chosen
    schedule's own first, then the order the schedules were searched in, a search's plan
    before a baseline, the lower objective). The chosen stages under another schedule at
    the same simulated time (GPipe and 1F1B often tie) only run the same ops in another
    order: such a plan is the runner-up only when no other exists. None when no other plan
    exists at all."""
    order = [s.name for s in searches]
    plans = [OtherPlan(s.name, p) for s in searches for p in s.ranked]
    if "1f1b" in order:  # the baselines are 1F1B plans: other plans where 1F1B is searched
        plans += [p for b in baselines if (p := baseline_proposal(table, b, micro)) is not None]
    best = _rounded(chosen.proposal.time)

    def rank(p: OtherPlan) -> tuple[bool, float, bool, int, bool, float]:
        time = _rounded(p.proposal.time)
        reordered = p.proposal.keys == chosen.proposal.keys and time == best
        where = order.index(p.schedule) if p.schedule in order else len(order)
        return (reordered, time, p.schedule != chosen.schedule, where,
                p.baseline is not None, p.proposal.proxy)  # fmt: skip

    others = [p for p in plans if p.identity != chosen.identity]
    return min(others, key=rank, default=None)


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


def _rounded(seconds: float) -> float:
    """Simulated times equal up to rounding compare equal."""
    return float(f"{seconds:.12g}") if math.isfinite(seconds) else seconds
