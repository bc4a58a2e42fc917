"""Simple plans from the same table, to compare the DP's plan against."""

from collections import Counter

import numpy as np

from planner.candidates import CandidateSpace
from planner.stages import planned_stage, simulate_stages
from planner.table import CostTable, Key
from schemas import BaselinePlan, ModelSpec


def best_config(
    table: CostTable, start: int, end: int, submesh_id: int, followers: int
) -> int | None:
    """The fastest ok config of a stage that allows `followers` stages after it, or None."""
    costs = table.dp_cost[start, end, submesh_id]
    allowed = np.isfinite(costs) & (table.max_n_succ_stages[start, end, submesh_id] >= followers)
    if not allowed.any():
        return None
    return int(np.where(allowed, costs, np.inf).argmin())


def _why_none(
    table: CostTable, space: CandidateSpace, start: int, end: int, m: int, followers: int
) -> str:
    """Why no config of this stage is usable, e.g. "2 oom, 1 not measured"."""
    counts: Counter[str] = Counter()
    for c in range(len(space.configs[m])):
        key = (start, end, m, c)
        status = table.statuses.get(key, "not measured")
        if status == "ok":
            limit = int(table.max_n_succ_stages[key])
            status = f"ok but allows {limit} stages after it, needs {followers}"
        counts[status] += 1
    what = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no configs"
    return f"layers {start}-{end} on {space.submeshes[m]}: no usable config ({what})"


def _plan(
    name: str,
    spec: ModelSpec,
    space: CandidateSpace,
    table: CostTable,
    ranges: list[tuple[int, int]],
    submesh_id: int,
    num_microbatches: int,
) -> BaselinePlan:
    keys: list[Key] = []
    for p, (start, end) in enumerate(ranges):
        c = best_config(table, start, end, submesh_id, len(ranges) - 1 - p)
        if c is None:
            return BaselinePlan(
                name=name,
                iteration_time_s=None,
                reason=_why_none(table, space, start, end, submesh_id, len(ranges) - 1 - p),
            )
        keys.append((start, end, submesh_id, c))
    schedule = simulate_stages(table, keys, num_microbatches)
    return BaselinePlan(
        name=name,
        iteration_time_s=schedule.iteration_time_s,
        stages=[planned_stage(spec, space, table, k) for k in keys],
        reason=None,
    )


def baseline_layouts(
    num_layers: int, space: CandidateSpace, num_devices: int
) -> list[tuple[str, list[tuple[int, int]], int | None]]:
    """The baselines' shapes: (name, layer ranges, submesh id or None when none fits).

    "data_parallel": one stage (0, L-1) on the whole-cluster submesh; "uniform_<n>": n equal
    contiguous stages on equal submeshes, for every n >= 2 that divides both the layers and
    the devices and has a submesh of that size."""
    by_size: dict[int, int] = {}
    for m, s in enumerate(space.submeshes):
        by_size.setdefault(s.num_devices, m)
    out: list[tuple[str, list[tuple[int, int]], int | None]] = [
        ("data_parallel", [(0, num_layers - 1)], by_size.get(num_devices))
    ]
    for n in range(2, min(num_layers, num_devices) + 1):
        if num_layers % n or num_devices % n or num_devices // n not in by_size:
            continue
        per = num_layers // n
        ranges = [(p * per, (p + 1) * per - 1) for p in range(n)]
        out.append((f"uniform_{n}", ranges, by_size[num_devices // n]))
    return out


def baseline_keys(num_layers: int, space: CandidateSpace, num_devices: int) -> set[Key]:
    """Every candidate a baseline may use: measured even when pruning would skip them."""
    return {
        (start, end, m, c)
        for _, ranges, m in baseline_layouts(num_layers, space, num_devices)
        if m is not None
        for start, end in ranges
        for c in range(len(space.configs[m]))
    }


def baseline_plans(
    spec: ModelSpec,
    space: CandidateSpace,
    table: CostTable,
    num_devices: int,
    num_microbatches: int,
) -> list[BaselinePlan]:
    """The baselines of `baseline_layouts`, each stage with its best usable config."""
    out = []
    for name, ranges, m in baseline_layouts(spec.num_layers, space, num_devices):
        if m is None:
            reason = "no submesh spans the whole cluster"
            out.append(BaselinePlan(name=name, iteration_time_s=None, reason=reason))
        else:
            out.append(_plan(name, spec, space, table, ranges, m, num_microbatches))
    return out
