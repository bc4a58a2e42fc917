"""From measured stage candidates to a pipeline `Plan` (Alpa's stage construction)."""

import logging
import time
from collections.abc import Mapping

import numpy as np

from planner.baselines import baseline_plans
from planner.candidates import CandidateSpace
from planner.dp import training_dp
from planner.errors import NoFeasiblePlan
from planner.stages import planned_stage, simulate_stages
from planner.table import CostTable, Key, build_cost_table
from schemas import (
    ClusterSpec,
    ManualStageOption,
    ModelSpec,
    Plan,
    PlannedStage,
    PlanOptions,
    StageKey,
    StageProfileResult,
)

logger = logging.getLogger(__name__)


def manual_stage_option(stages: list[PlannedStage]) -> ManualStageOption:
    """The plan in the shape of Alpa's `ManualStageOption`, for replaying it."""
    return ManualStageOption(
        forward_stage_layer_ids=[list(range(s.start, s.end + 1)) for s in stages],
        submesh_physical_shapes=[s.submesh.as_tuple() for s in stages],
        submesh_logical_shapes=[s.config.logical_mesh for s in stages],
        submesh_autosharding_option_dicts=[dict(s.config.options) for s in stages],
    )


def explain_infeasible(
    table: CostTable, space: CandidateSpace, num_layers: int, num_devices: int
) -> str:
    """Why the DP found no plan: every candidate failed, memory, or uncovered ranges."""
    num_ok = len(table.results)
    if not space.keys and not table.statuses:
        return "there are no stage candidates (no sharding config fits any submesh)"
    if num_ok == 0:
        return f"every candidate failed: {table.failure_summary()}"
    sizes = [s.as_tuple() for s in space.submeshes]
    unlimited = training_dp(table.dp_cost, None, sizes, num_devices, 1)
    if unlimited.feasible:
        fitting = int((table.max_n_succ_stages[np.isfinite(table.dp_cost)] >= 0).sum())
        return (
            f"no combination of stages uses all {num_devices} devices within memory limits "
            f"({fitting} of {num_ok} measured candidates fit in memory at all; "
            f"failed: {table.failure_summary()})"
        )
    return (
        f"no combination of measured stages covers all {num_layers} layers on exactly "
        f"{num_devices} devices ({num_ok} candidates ok; failed: {table.failure_summary()})"
    )


def build_plan(
    spec: ModelSpec,
    cluster: ClusterSpec,
    options: PlanOptions,
    space: CandidateSpace,
    results: Mapping[Key, StageProfileResult] | Mapping[StageKey, StageProfileResult],
) -> Plan:
    """Run the stage DP on the measured results and describe the plan it picks.

    Missing or failed candidates are infeasible; with `options.include_communication` the
    stage times include activation transfers. Adds the 1F1B schedule, the baselines and the
    `ManualStageOption` export. Raises `NoFeasiblePlan` with the reason when none exists.
    """
    num_devices, num_layers = cluster.num_devices, spec.num_layers
    table = build_cost_table(spec, cluster, space, results, options.include_communication)
    began = time.perf_counter()
    result = training_dp(
        table.dp_cost,
        table.max_n_succ_stages,
        [s.as_tuple() for s in space.submeshes],
        num_devices,
        options.num_microbatches,
    )
    dp_seconds = time.perf_counter() - began
    if not result.feasible:
        raise NoFeasiblePlan(explain_infeasible(table, space, num_layers, num_devices))
    logger.info(
        "DP: %d stages, cost %.6g s, %d bounds solved in %.3f s",
        len(result.stages),
        result.cost,
        result.num_bounds_solved,
        dp_seconds,
    )
    stages = [planned_stage(spec, space, table, k) for k in result.stages]
    schedule = simulate_stages(table, result.stages, options.num_microbatches)
    return Plan(
        stages=stages,
        num_microbatches=options.num_microbatches,
        num_layers=num_layers,
        num_devices=num_devices,
        dp_cost_s=result.cost,
        predicted_iteration_time_s=schedule.iteration_time_s,
        bubble_fraction=schedule.bubble_fraction,
        dp_wall_seconds=dp_seconds,
        include_communication=options.include_communication,
        baselines=baseline_plans(spec, space, table, num_devices, options.num_microbatches),
        schedule=schedule.events,
        manual_stage_option=manual_stage_option(stages),
    )
