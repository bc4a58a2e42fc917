"""Pure numpy planning: submesh and config choices, the stage searches, the schedule models.

Turns a table of stage measurements into a pipeline plan (Alpa's stage construction), for
the schedule asked for (GPipe, 1F1B, interleaved 1F1B, ZB-H1) or the fastest of them.
"""

from planner.baselines import baseline_keys, baseline_plans
from planner.candidates import CandidateSpace, enumerate_candidates, remat_choices
from planner.choices import config_choices, logical_meshes, submesh_choices
from planner.comm import boundary_bytes, transfer_seconds
from planner.dp import DPResult, inference_dp, training_dp
from planner.errors import NoFeasiblePlan
from planner.estimate import StageEstimator
from planner.layer_profiles import (
    is_layer_profile,
    is_profiled,
    layer_profile_keys,
    with_layer_profiles,
)
from planner.outside import with_layers_outside
from planner.plan import build_plan, manual_stage_option
from planner.prune import StagePruner, range_lower_bounds
from planner.remat import as_written_sibling, remat_worth_measuring, room_needed
from planner.runner_up import runner_up_dp
from planner.schedule import SCHEDULES, Schedule, simulate, simulate_1f1b
from planner.search import ScheduleSearch, search_schedule
from planner.table import CostTable, build_cost_table
from planner.verify import EstimateSearch

__all__ = [
    "as_written_sibling",
    "CandidateSpace",
    "CostTable",
    "DPResult",
    "EstimateSearch",
    "SCHEDULES",
    "NoFeasiblePlan",
    "Schedule",
    "ScheduleSearch",
    "StageEstimator",
    "StagePruner",
    "baseline_keys",
    "baseline_plans",
    "boundary_bytes",
    "build_cost_table",
    "build_plan",
    "config_choices",
    "enumerate_candidates",
    "remat_choices",
    "remat_worth_measuring",
    "room_needed",
    "inference_dp",
    "is_layer_profile",
    "is_profiled",
    "layer_profile_keys",
    "logical_meshes",
    "manual_stage_option",
    "range_lower_bounds",
    "runner_up_dp",
    "search_schedule",
    "simulate",
    "simulate_1f1b",
    "submesh_choices",
    "training_dp",
    "transfer_seconds",
    "with_layer_profiles",
    "with_layers_outside",
]
