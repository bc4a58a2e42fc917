"""From measured stage candidates to a pipeline `Plan` (Alpa's stage construction)."""

import json
import logging
import time
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from planner.baselines import baseline_plans
from planner.candidates import CandidateSpace
from planner.dp import training_dp
from planner.errors import NoFeasiblePlan
from planner.runner_up import runner_up_dp
from planner.stability import assess, plan_cost_spread, relative_gap
from planner.stages import planned_stage, simulate_stages
from planner.table import CostTable, Key, build_cost_table
from schemas import (
    ClusterSpec,
    ManualStageOption,
    ModelSpec,
    Plan,
    PlannedStage,
    PlanOptions,
    RunnerUpPlan,
    ShardingConfig,
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


def config_key(config: ShardingConfig) -> tuple[tuple[int, int], str, str]:
    """What a config is, for the DP's tie order: logical mesh, strategy, options (as JSON)."""
    dp, tp = config.logical_mesh
    return ((dp, tp), config.strategy, json.dumps(config.options, sort_keys=True, default=str))


def config_ranks(space: CandidateSpace) -> NDArray[np.int64]:
    """`[S, C]`: each config's rank among its submesh's configs by `config_key`, so that ties
    in the DP do not depend on the order the configs were enumerated in (e.g. the order of
    `PlanOptions.strategies`). Padding (no such config) ranks last."""
    num_configs = space.max_configs
    ranks = np.tile(np.arange(num_configs, dtype=np.int64), (len(space.submeshes), 1))
    for m, configs in enumerate(space.configs):
        order = sorted(range(len(configs)), key=lambda c: (config_key(configs[c]), c))
        ranks[m, order] = np.arange(len(configs))
    return ranks


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
    stage times include activation transfers. Ties go by the DP's order, with configs ranked
    by what they are (`config_ranks`), so the same results give the same plan whatever the
    order of the submeshes or configs. Adds the 1F1B schedule, the baselines, the
    `ManualStageOption` export, the runner-up plan and the stability verdict (its gap
    against the measured spread). Raises `NoFeasiblePlan` with the reason when none exists.
    """
    num_devices, num_layers = cluster.num_devices, spec.num_layers
    micro = options.num_microbatches
    table = build_cost_table(spec, cluster, space, results, options.include_communication)
    shapes = [s.as_tuple() for s in space.submeshes]
    ranks = config_ranks(space)
    began = time.perf_counter()
    result = training_dp(
        table.dp_cost, table.max_n_succ_stages, shapes, num_devices, micro, config_rank=ranks
    )
    dp_seconds = time.perf_counter() - began
    if not result.feasible:
        raise NoFeasiblePlan(explain_infeasible(table, space, num_layers, num_devices))
    began = time.perf_counter()
    other = runner_up_dp(
        table.dp_cost,
        table.max_n_succ_stages,
        shapes,
        num_devices,
        micro,
        result,
        config_rank=ranks,
    )
    runner_up_seconds = time.perf_counter() - began
    logger.info(
        "DP: %d stages, cost %.6g s, %d bounds solved in %.3f s; runner-up %.6g s, "
        "%d bounds solved in %.3f s",
        len(result.stages),
        result.cost,
        result.num_bounds_solved,
        dp_seconds,
        other.cost,
        other.num_bounds_solved,
        runner_up_seconds,
    )
    stages = [planned_stage(spec, space, table, k) for k in result.stages]
    schedule = simulate_stages(table, result.stages, micro)
    spread = plan_cost_spread(table, result.stages, micro)
    runner_up = None
    if other.feasible:
        runner_up = RunnerUpPlan(
            dp_cost_s=other.cost,
            gap=relative_gap(result.cost, other.cost),
            cost_spread=plan_cost_spread(table, other.stages, micro),
            predicted_iteration_time_s=simulate_stages(table, other.stages, micro).iteration_time_s,
            stages=[planned_stage(spec, space, table, k) for k in other.stages],
        )
    noise = max(spread, runner_up.cost_spread) if runner_up else spread
    return Plan(
        stages=stages,
        num_microbatches=micro,
        num_layers=num_layers,
        num_devices=num_devices,
        dp_cost_s=result.cost,
        predicted_iteration_time_s=schedule.iteration_time_s,
        bubble_fraction=schedule.bubble_fraction,
        dp_wall_seconds=dp_seconds,
        include_communication=options.include_communication,
        baselines=baseline_plans(spec, space, table, num_devices, micro),
        schedule=schedule.events,
        manual_stage_option=manual_stage_option(stages),
        cost_spread=spread,
        runner_up=runner_up,
        stability=assess(result.cost, other.cost if other.feasible else None, noise),
        runner_up_wall_seconds=runner_up_seconds,
    )
