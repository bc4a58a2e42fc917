"""Turning chosen stage keys into `PlannedStage`s and a simulated schedule."""

from collections.abc import Sequence

from planner.candidates import CandidateSpace
from planner.schedule import Schedule, simulate_1f1b
from planner.table import CostTable, Key
from schemas import ModelSpec, PlannedStage


def planned_stage(
    spec: ModelSpec, space: CandidateSpace, table: CostTable, key: Key
) -> PlannedStage:
    """One stage of a plan, with its measured costs and memory."""
    start, end, m, c = key
    result = table.results[key]
    submesh, config = space.resolve(key)
    return PlannedStage(
        start=start,
        end=end,
        layer_names=[layer.name for layer in spec.layers[start : end + 1]],
        submesh_id=m,
        config_id=c,
        submesh=submesh,
        config=config,
        forward_cost=result.forward_cost,
        backward_cost=result.backward_cost,
        compute_cost=result.compute_cost,
        comm_cost_s=float(table.comm_forward[start, end, m] + table.comm_backward[start, end, m]),
        peak_memory=result.peak_memory,
        initial_var_size=result.initial_var_size,
        intermediate_size=result.intermediate_size,
        max_n_succ_stages=result.max_n_succ_stages,
        fingerprint=result.fingerprint,
        flops=result.flops,
        remat=config.remat,
    )


def simulate_stages(table: CostTable, keys: Sequence[Key], num_microbatches: int) -> Schedule:
    """The 1F1B schedule of these stages (transfer time, if any, added to each op)."""
    times = [table.stage_seconds(k) for k in keys]
    return simulate_1f1b([f for f, _ in times], [b for _, b in times], num_microbatches)
