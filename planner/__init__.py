"""Pure numpy planning: submesh and config choices, the stage DP, the 1F1B schedule model.

Turns a table of stage measurements into a pipeline plan (Alpa's stage construction).
"""

from planner.baselines import baseline_keys, baseline_plans
from planner.candidates import CandidateSpace, enumerate_candidates
from planner.choices import config_choices, logical_meshes, submesh_choices
from planner.comm import boundary_bytes, transfer_seconds
from planner.dp import DPResult, inference_dp, training_dp
from planner.errors import NoFeasiblePlan
from planner.plan import build_plan, manual_stage_option
from planner.prune import StagePruner, range_lower_bounds
from planner.runner_up import runner_up_dp
from planner.schedule import Schedule, simulate_1f1b
from planner.table import CostTable, build_cost_table

__all__ = [
    "CandidateSpace",
    "CostTable",
    "DPResult",
    "NoFeasiblePlan",
    "Schedule",
    "StagePruner",
    "baseline_keys",
    "baseline_plans",
    "boundary_bytes",
    "build_cost_table",
    "build_plan",
    "config_choices",
    "enumerate_candidates",
    "inference_dp",
    "logical_meshes",
    "manual_stage_option",
    "range_lower_bounds",
    "runner_up_dp",
    "simulate_1f1b",
    "submesh_choices",
    "training_dp",
    "transfer_seconds",
]
