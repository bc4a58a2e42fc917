"""Plans as an estimate search (`PlanOptions.search: estimate`) answers them: a search
summary, stages with their estimates, runner-up and baseline stages estimated only."""

from schemas import Plan, PlannedStage, SearchSummary, SubmeshShape

# What `with_search` says the search did.
SEARCH = SearchSummary(
    mode="estimate",
    layer_profiles=10,
    verified=2,
    estimated=90,
    rounds=2,
    estimate_error_median=0.041,
    estimate_error_max=0.098,
    error_band=0.15,
    compared=8,
)
ESTIMATE_ERROR = 0.05  # how far above the measured time the made-up estimates are


def estimated(stage: PlannedStage, *, measured: bool = True) -> PlannedStage:
    """`stage` with an estimate `ESTIMATE_ERROR` above its time; `measured=False`: its
    numbers are that estimate's only."""
    cost = stage.compute_cost * (1 + ESTIMATE_ERROR)
    return stage.model_copy(update={"measured": measured, "estimated_cost_s": cost})


def with_search(plan: Plan, summary: SearchSummary = SEARCH) -> Plan:
    """`plan` as an estimate search answers it: its stages measured, each with an estimate;
    the runner-up's last stage and the data-parallel baseline's one stage (the whole model
    on submesh 1, two devices) estimated only; `summary` as its search."""
    runner_up = plan.runner_up
    if runner_up is not None:
        *head, last = runner_up.stages
        stages = [*map(estimated, head), estimated(last, measured=False)]
        runner_up = runner_up.model_copy(update={"stages": stages})
    whole = plan.stages[0].model_copy(
        update={
            "end": plan.num_layers - 1,
            "layer_names": [name for st in plan.stages for name in st.layer_names],
            "submesh_id": 1,
            "submesh": SubmeshShape(hosts=1, devices_per_host=2),
        }
    )
    baselines = [
        b.model_copy(update={"stages": [estimated(whole, measured=False)]})
        if b.name == "data_parallel"
        else b
        for b in plan.baselines
    ]
    return plan.model_copy(
        update={
            "stages": [estimated(st) for st in plan.stages],
            "runner_up": runner_up,
            "baselines": baselines,
            "search": summary,
        }
    )
