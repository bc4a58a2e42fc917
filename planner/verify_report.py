"""What an estimate search (`planner.verify`) reports with its plan: each stage marked
measured or not, with its estimate, and the search's summary (`SearchSummary`)."""

import statistics
from collections.abc import Mapping
from typing import Protocol

from planner.estimate import StageEstimator
from planner.layer_profiles import is_profiled
from planner.table import Key
from schemas import Plan, PlannedStage, SearchSummary, StageProfileResult


class ReportedSearch(Protocol):
    """What the report reads of a search (`planner.verify.EstimateSearch`)."""

    estimator: StageEstimator
    estimated_at_choice: dict[Key, float]
    split_later: set[Key]
    rounds: int

    @property
    def measured(self) -> dict[Key, StageProfileResult]: ...

    def errors(self) -> list[float]: ...

    def band(self) -> float: ...


def stage_key(stage: PlannedStage) -> Key:
    """The candidate key of a planned stage."""
    return (stage.start, stage.end, stage.submesh_id, stage.config_id)


def annotated(search: ReportedSearch, plan: Plan, point: Mapping[Key, float]) -> Plan:
    """`plan` with every stage (its runner-up's and baselines' too) marked measured or not,
    with its estimate (`point`, else the one it had when chosen), and the summary."""

    def mark(stages: list[PlannedStage]) -> list[PlannedStage]:
        out = []
        for st in stages:
            key = stage_key(st)
            est = point.get(key, search.estimated_at_choice.get(key))
            update = {"measured": key in search.measured, "estimated_cost_s": est}
            out.append(st.model_copy(update=update))
        return out

    runner_up = plan.runner_up
    if runner_up is not None:
        runner_up = runner_up.model_copy(
            update={"stages": mark(runner_up.stages), "outside": mark(runner_up.outside)}
        )
    baselines = [b.model_copy(update={"stages": mark(b.stages)}) for b in plan.baselines]
    return plan.model_copy(
        update={
            "stages": mark(plan.stages),
            "outside": mark(plan.outside),
            "runner_up": runner_up,
            "baselines": baselines,
            "search": summary(search, point),
        }
    )


def summary(search: ReportedSearch, point: Mapping[Key, float]) -> SearchSummary:
    """What the search measured and how good its estimates were (`point`: the estimated
    candidates' costs; distinct stages are counted once per submesh and config and range)."""
    errors = search.errors()
    measured = list(search.measured)
    classes = search.estimator.layer_classes
    return SearchSummary(
        mode="estimate",
        layer_profiles=sum(1 for k in measured if is_profiled(k, classes)),
        verified=sum(1 for k in measured if not is_profiled(k, classes)),
        estimated=len(point),
        split_on_demand=len({search.measured[k].fingerprint for k in search.split_later}),
        rounds=search.rounds,
        estimate_error_median=statistics.median(errors) if errors else None,
        estimate_error_max=max(errors) if errors else None,
        error_band=search.band(),
        compared=len(errors),
    )
