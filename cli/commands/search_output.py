"""What `stageprof plan` says about its search (`Plan.search`): how many stages it measured
(layer profiles, verified) and estimated, how far its estimates were from the measurements,
and which runner-up or baseline stages are estimates only."""

from schemas import Plan, PlannedStage
from schemas.plan import SearchSummary, percent


def estimated_note(stages: list[PlannedStage]) -> str:
    """e.g. "2 of 4 stages estimated" ("" when every stage was measured)."""
    n = sum(1 for st in stages if not st.measured)
    if not n:
        return ""
    return f"{n} of {len(stages)} stage{'s' if len(stages) != 1 else ''} estimated"


def estimated_ms(stage: PlannedStage) -> str:
    """The job's estimate of the stage's forward + backward, ms ("-" when none)."""
    cost = stage.estimated_cost_s
    return "-" if cost is None else f"{cost * 1e3:.2f}"


def shows_estimates(plan: Plan) -> bool:
    """Whether the plan's tables get the estimate column: it was searched with estimates."""
    stages = [*plan.stages, *(plan.runner_up.stages if plan.runner_up else [])]
    stages += [st for b in plan.baselines for st in b.stages]
    return plan.search is not None or any(
        st.estimated_cost_s is not None or not st.measured for st in stages
    )


def search_lines(plan: Plan) -> list[str]:
    """The search in two short lines (none for a plan without a summary), e.g.
    "estimate search: 12 measured (10 layer profiles, 2 verified), 90 estimated, 2 rounds"
    "estimate error over 8 stages: median 4.1%, max 9.8% of the measured time; band 15.0%"."""
    summary = plan.search
    if summary is None:
        return []
    if summary.mode != "estimate":
        what = "every candidate" if summary.mode == "exhaustive" else "every stage that could win"
        return [f"{summary.mode} search: measured {what}"]
    measured = summary.layer_profiles + summary.verified
    rounds = f"{summary.rounds} verification round{'s' if summary.rounds != 1 else ''}"
    split = f", {summary.split_on_demand} split on demand" if summary.split_on_demand else ""
    counts = (
        f"estimate search: {measured} measured ({summary.layer_profiles} layer profiles, "
        f"{summary.verified} verified{split}), {summary.estimated} estimated, {rounds}"
    )
    return [counts, error_line(summary)]


def error_line(summary: SearchSummary) -> str:
    """How far the job's estimates were from what it measured afterwards, and the band."""
    band = "" if summary.error_band is None else f"; band {percent(summary.error_band)}"
    median, worst = summary.estimate_error_median, summary.estimate_error_max
    if not summary.compared or median is None or worst is None:
        return f"estimate error: no stage was measured after being estimated{band}"
    n = summary.compared
    return (
        f"estimate error over {n} stage{'s' if n != 1 else ''}: median {percent(median)}, "
        f"max {percent(worst)} (|estimate - measured| / measured){band}"
    )
