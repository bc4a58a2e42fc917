"""From measured stage candidates to a pipeline `Plan` (Alpa's stage construction)."""

import json
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from planner.baselines import baseline_plans
from planner.candidates import CandidateSpace
from planner.dp import training_dp
from planner.errors import NoFeasiblePlan
from planner.outside import search_with_outside
from planner.remat import memory_misses
from planner.search import Proposal, ScheduleSearch
from planner.stability import (
    OtherPlan,
    assess,
    plan_cost_spread,
    relative_gap,
    runner_up_among,
)
from planner.stages import planned_stage
from planner.table import CostTable, Key, build_cost_table
from planner.trainers import maxtext_search
from schemas import (
    ClusterSpec,
    ManualStageOption,
    ModelSpec,
    Plan,
    PlannedStage,
    PlanOptions,
    RunnerUpPlan,
    ScheduleOption,
    ShardingConfig,
    StageKey,
    StageProfileResult,
)
from schemas.plan import ScheduleName, stage_layout

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
    what: Any = config.options
    if config.mesh_axes is not None:  # mesh-axes configs of one (dp, tp) differ by their axes
        what = {"options": config.options, "mesh_axes": config.mesh_axes, "rules": config.rules}
    return ((dp, tp), config.strategy, json.dumps(what, sort_keys=True, default=str))


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
    table: CostTable | None = None,
) -> Plan:
    """Search each schedule asked for on the measured results and describe the best plan.

    `options.schedule`: one schedule, or `auto`: every one, the fastest in simulated time
    answering (ties: 1f1b, gpipe, zb-h1, interleaved) and all of them shown side by side
    (`Plan.schedules`). Each search proposes its best plans under its schedule's objective
    and memory rule and the simulator re-ranks them (`planner.search`); the runner-up is the
    fastest other plan of any schedule or baseline (`planner.stability.runner_up_among`),
    never faster in simulated time. Missing or failed candidates are infeasible;
    with `options.include_communication` the stage times include activation transfers. Adds
    the baselines (1F1B), the `ManualStageOption` export (not for interleaved: Alpa has no
    form for chunks sharing devices) and the stability verdict (the
    runner-up's gap against the measured spread). Raises `NoFeasiblePlan` with the reason
    when no schedule has a plan. `table`: the cost table to plan on, when the caller built
    it (e.g. with estimates filled in); `results` are then not read.
    """
    num_devices, num_layers = cluster.num_devices, spec.num_layers
    micro = options.num_microbatches
    if table is None:
        table = build_cost_table(spec, cluster, space, results, options.include_communication)
    ranks = config_ranks(space)
    names = AUTO_ORDER if options.schedule == "auto" else (options.schedule,)
    began = time.perf_counter()
    outside = options.allows_outside
    searches = [
        search_with_outside(
            n, spec, table, space, num_devices, micro, ranks, options.virtual_stages, outside
        )
        for n in names
    ]
    search_seconds = time.perf_counter() - began
    feasible = [s for s in searches if s.best is not None]
    if not feasible:
        why = _why_none(searches, table, space, num_layers, num_devices)
        misses = memory_misses(table, space, num_devices, micro)
        raise NoFeasiblePlan(f"{why}; {misses}" if misses else why)
    chosen = min(feasible, key=lambda s: (_key_time(s), names.index(s.name)))
    best = chosen.ranked[0]
    for s in searches:
        logger.info(
            "schedule %s: %s in %.3f s", s.name, _summary(s) if s.best else s.reason, s.seconds
        )
    stages = _stages(spec, space, table, chosen.name, best)
    spread = plan_cost_spread(table, best.keys, micro)
    baselines = baseline_plans(spec, space, table, num_devices, micro)
    runner_up = None
    other = runner_up_among(table, searches, OtherPlan(chosen.name, best), baselines, micro)
    if other is not None:
        prop = other.proposal
        runner_up = RunnerUpPlan(
            dp_cost_s=prop.proxy,
            gap=relative_gap(best.time, prop.time),
            cost_spread=plan_cost_spread(table, prop.keys, micro),
            predicted_iteration_time_s=prop.time,
            stages=_stages(spec, space, table, other.schedule, prop),
            schedule_name=other.schedule,  # type: ignore[arg-type]
            virtual_stages=prop.virtual_stages,
            baseline=other.baseline,
            outside=[planned_stage(spec, space, table, k) for k in prop.outside],
        )
    noise = max(spread, runner_up.cost_spread) if runner_up else spread
    other_time = runner_up.predicted_iteration_time_s if runner_up else None
    maxtext = None
    if options.target == "maxtext":
        maxtext = maxtext_search(spec, cluster, space, table, micro, stages, best.time, chosen.name)
    return Plan(
        stages=stages,
        num_microbatches=micro,
        num_layers=num_layers,
        num_devices=num_devices,
        dp_cost_s=best.proxy,
        predicted_iteration_time_s=best.time,
        bubble_fraction=best.schedule.bubble_fraction,
        dp_wall_seconds=search_seconds,
        include_communication=options.include_communication,
        baselines=baselines,
        schedule=best.schedule.events,
        # Alpa replays one stage per submesh: an interleaved plan's chunks, or layers run
        # outside the pipeline, have no such form.
        manual_stage_option=(
            manual_stage_option(stages) if best.virtual_stages == 1 and not best.outside else None
        ),
        cost_spread=spread,
        runner_up=runner_up,
        stability=assess(best.time, other_time, noise),
        runner_up_wall_seconds=chosen.seconds,
        schedule_name=chosen.name,  # type: ignore[arg-type]
        virtual_stages=best.virtual_stages,
        peak_memory=int(max(best.memory)),
        schedules=[_option(spec, space, table, s, s is chosen) for s in searches],
        target=options.target,
        maxtext=maxtext,
        outside=[planned_stage(spec, space, table, k) for k in best.outside],
        outside_time_s=best.outside_s,
    )


AUTO_ORDER: tuple[ScheduleName, ...] = ("1f1b", "gpipe", "zb-h1", "interleaved")


def _key_time(search: ScheduleSearch) -> float:
    best = search.best
    return float(f"{best.time:.12g}") if best else math.inf


def _summary(search: ScheduleSearch) -> str:
    best = search.best
    assert best is not None
    return f"{len(best.keys)} stages, v={best.virtual_stages}, {best.time:.6g} s simulated"


def _stages(
    spec: ModelSpec, space: CandidateSpace, table: CostTable, name: str, prop: Proposal
) -> list[PlannedStage]:
    """The proposal's stages with their device group, split times and predicted memory."""
    out = []
    for s, key in enumerate(prop.keys):
        stage = planned_stage(spec, space, table, key)
        result = table.results[key]
        b, w = result.input_grad_cost, result.weight_grad_cost
        split = math.isfinite(b) and math.isfinite(w)
        out.append(
            stage.model_copy(
                update={
                    "device_group": s % prop.num_groups,
                    "input_grad_cost": b if split else None,
                    "weight_cost": w if split else None,
                    "schedule_memory": int(prop.memory[s]),
                }
            )
        )
    return out


def _option(
    spec: ModelSpec, space: CandidateSpace, table: CostTable, search: ScheduleSearch, chosen: bool
) -> ScheduleOption:
    best = search.best
    if best is None:
        return ScheduleOption(
            schedule=search.name,  # type: ignore[arg-type]
            feasible=False,
            reason=search.reason,
            search_seconds=search.seconds,
        )
    return ScheduleOption(
        schedule=search.name,  # type: ignore[arg-type]
        virtual_stages=best.virtual_stages,
        feasible=True,
        predicted_iteration_time_s=best.time,
        bubble_fraction=best.schedule.bubble_fraction,
        peak_memory=int(max(best.memory)),
        dp_cost_s=best.proxy,
        search_seconds=search.seconds,
        layout=stage_layout([planned_stage(spec, space, table, k) for k in best.keys])
        + "".join(f" · {k[0]} outside on all devices" for k in best.outside),
        chosen=chosen,
    )


def _why_none(
    searches: list[ScheduleSearch],
    table: CostTable,
    space: CandidateSpace,
    num_layers: int,
    num_devices: int,
) -> str:
    """The 1F1B reason (failures, memory, uncovered ranges: they hold for every schedule);
    a single other schedule asked for leads with its own."""
    base = explain_infeasible(table, space, num_layers, num_devices)
    if any(s.name == "1f1b" for s in searches):
        return base
    return "; ".join(f"{s.name}: {s.reason}" for s in searches) + f" ({base})"
