"""Each schedule's search against a brute force over every plan, the simulator's re-ranking,
`auto`, and what the plan says about its schedule."""

import math
import random

import numpy as np
import pytest

from planner import NoFeasiblePlan, build_plan, enumerate_candidates
from planner.plan import config_ranks
from planner.schedule import interleaved_in_flight
from planner.search import proposals
from planner.sum_max_dp import objective, sum_max_dp
from planner.table import build_cost_table
from schemas import Plan, PlanOptions
from tests.planner.brute_force import all_plans, brute_sum_max
from tests.planner.helpers import MEMORY_SCALE, SMALL_DEVICE, cluster, split_result
from tests.planner.helpers import programless_chain_spec as chain_spec

MICRO = 4


def random_results(
    space, rng: random.Random, tight: bool, split: bool = True, missing: float = 0.15
):
    """A random measured table; `tight`: memory that binds (some stages fit few micro-batches);
    `missing`: the share of candidates left unmeasured."""
    out = {}
    for key in space.keys:
        if rng.random() < missing:
            continue  # not measured
        submesh, config = space.resolve(key)
        n = key.end - key.start + 1
        f = n * rng.uniform(0.5, 1.5) / submesh.num_devices
        out[key.as_tuple()] = split_result(
            submesh,
            config,
            f,
            f * rng.uniform(0.5, 1.5),
            f * rng.uniform(0.3, 1.2),
            num_layers=n,
            available=SMALL_DEVICE,
            peak=rng.randint(1000, 3000) * MEMORY_SCALE,
            initial=rng.randint(0, 2000) * MEMORY_SCALE,
            intermediate=(rng.randint(200, 3000) if tight else 10) * MEMORY_SCALE,
            weight_stash=(rng.randint(50, 1500) if tight else 5) * MEMORY_SCALE,
            split=split,
        )
    return out


def brute(name: str, table, space, devices: int, micro: int) -> float:
    """The least objective of the schedule over every plan obeying its memory rule, from the
    table's measured numbers (re-derived here, not taken from the search)."""
    sizes = [s.num_devices for s in space.submeshes]
    cost = table.dp_cost
    num_layers = cost.shape[0]
    best = math.inf
    if name in ("1f1b", "gpipe", "zb-h1"):
        for plan in all_plans(
            cost if name != "zb-h1" else table.forward + table.input_grad, sizes, devices
        ):
            n = len(plan)
            if name == "zb-h1":
                if not all(math.isfinite(table.weight_grad[k]) for k in plan):
                    continue
                stash = [table.intermediate[k] + table.weight_stash[k] for k in plan]
                if any((n - p) * stash[p] > table.free_bytes[k] for p, k in enumerate(plan)):
                    continue
                a = [float(table.forward[k] + table.input_grad[k]) for k in plan]
                b = [x + float(table.weight_grad[k]) for x, k in zip(a, plan, strict=True)]
            else:
                need = [n - 1 - p if name == "1f1b" else micro - 1 for p in range(n)]
                if any(table.max_n_succ_stages[k] < q for k, q in zip(plan, need, strict=True)):
                    continue
                a = b = [float(cost[k]) for k in plan]
            best = min(best, sum(a) + (micro - 1) * max(b))
        return best
    for m, sub in enumerate(space.submeshes):
        p = devices // sub.num_devices
        if devices % sub.num_devices or p < 2 or micro % p:
            continue
        for v in range(2, num_layers // p + 1):
            kept = interleaved_in_flight(p, v, micro)
            t = cost[:, :, m : m + 1, :]
            for plan in all_plans(t, [0], 0):
                if len(plan) != p * v:
                    continue
                keys = [(i, e, m, c) for i, e, _, c in plan]
                budget = [table.available[k] / v - table.fixed_bytes[k] for k in keys]
                if any(kept[j] * table.intermediate[k] > budget[j] for j, k in enumerate(keys)):
                    continue
                times = [float(cost[k]) for k in keys]
                best = min(best, sum(times) / v + (micro * v - 1) * max(times))
    return best


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("name", ["1f1b", "gpipe", "zb-h1", "interleaved"])
def test_each_search_equals_a_brute_force_over_every_plan(name: str, seed: int) -> None:
    rng = random.Random(seed * 7 + len(name))
    num_layers, micro = rng.choice([3, 4]), rng.choice([2, 4])
    spec, clu = chain_spec(num_layers), cluster(1, 4, SMALL_DEVICE)
    options = PlanOptions(num_microbatches=micro, strategies=["data"])
    space = enumerate_candidates(spec, clu, options)
    table = build_cost_table(spec, clu, space, random_results(space, rng, tight=seed % 2 == 0))
    found, _ = proposals(name, table, space, 4, micro, config_ranks(space))
    expected = brute(name, table, space, 4, micro)
    got = min((value for value, *_ in found), default=math.inf)
    if math.isinf(expected):
        assert not found
    else:
        assert got == pytest.approx(expected, rel=1e-9)


def test_the_sum_max_dp_equals_a_brute_force_on_random_tables() -> None:
    rng = np.random.default_rng(0)
    for _ in range(150):
        n, k, devices = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.choice([2, 4]))
        sizes = rng.choice([1, 2, 4], size=k)
        a = rng.uniform(0.1, 2, (n, n, k))
        a[rng.random((n, n, k)) < 0.2] = np.inf
        a[np.tril_indices(n, -1)] = np.inf
        b = np.where(np.isfinite(a), a + rng.uniform(0, 1, (n, n, k)), np.inf)
        exact = int(rng.integers(1, 4)) if rng.random() < 0.3 else 0
        allow = rng.random((exact or int(rng.integers(1, 4)), n, n, k)) < 0.8
        weight = float(rng.integers(0, 6))
        result = sum_max_dp(a, b, allow, sizes, devices, weight, exact)
        expected = brute_sum_max(a, b, allow, list(sizes), devices, weight, exact)
        if math.isinf(expected):
            assert not result.feasible
            continue
        assert result.cost == pytest.approx(expected)
        plan = result.stages
        assert objective(a, b, plan, weight) == pytest.approx(expected)
        assert plan[0][0] == 0 and plan[-1][1] == n - 1
        assert all(x[1] + 1 == y[0] for x, y in zip(plan, plan[1:], strict=False))
        assert sum(int(sizes[s[2]]) for s in plan) == devices


def _plan(
    seed: int, schedule: str = "auto", split: bool = True, micro: int = 4, missing: float = 0.15
) -> Plan:
    rng = random.Random(seed)
    spec, clu = chain_spec(4), cluster(1, 4, SMALL_DEVICE)
    options = PlanOptions(num_microbatches=micro, strategies=["data"], schedule=schedule)
    space = enumerate_candidates(spec, clu, options)
    results = random_results(space, rng, tight=False, split=split, missing=missing)
    return build_plan(spec, clu, options, space, results)


@pytest.mark.parametrize("seed", range(5))
def test_auto_answers_the_fastest_schedule_and_never_a_slower_plan_than_its_runner_up(
    seed: int,
) -> None:
    plan = _plan(seed)
    assert [o.schedule for o in plan.schedules] == ["1f1b", "gpipe", "zb-h1", "interleaved"]
    chosen = [o for o in plan.schedules if o.chosen]
    assert len(chosen) == 1 and chosen[0].schedule == plan.schedule_name
    assert chosen[0].predicted_iteration_time_s == plan.predicted_iteration_time_s
    times = [o.predicted_iteration_time_s for o in plan.schedules if o.feasible]
    assert plan.predicted_iteration_time_s == pytest.approx(min(times), rel=1e-12)
    for name in ("1f1b", "gpipe", "zb-h1", "interleaved"):
        option = next(o for o in plan.schedules if o.schedule == name)
        if not option.feasible:
            with pytest.raises(NoFeasiblePlan, match=name):
                _plan(seed, schedule=name)
            continue
        one = _plan(seed, schedule=name)
        assert one.schedule_name == name and [o.schedule for o in one.schedules] == [name]
        assert option.predicted_iteration_time_s == pytest.approx(one.predicted_iteration_time_s)
        if one.runner_up is not None:
            assert one.runner_up.predicted_iteration_time_s >= one.predicted_iteration_time_s
        groups = {s.device_group for s in one.stages}
        assert groups == set(range(one.num_device_groups))
        assert {e.group for e in one.schedule} == groups
        assert all(s.schedule_memory and s.schedule_memory > 0 for s in one.stages)
    zb = _plan(seed, schedule="zb-h1")
    assert {e.kind for e in zb.schedule} == {"forward", "backward", "weight"}
    assert all(s.weight_cost is not None and s.input_grad_cost is not None for s in zb.stages)


def test_zb_h1_is_not_measured_without_the_split_and_never_assumed() -> None:
    plan = _plan(1, split=False)
    zb = next(o for o in plan.schedules if o.schedule == "zb-h1")
    assert not zb.feasible and zb.reason and zb.reason.startswith("not measured")
    assert plan.schedule_name != "zb-h1"
    assert all(s.weight_cost is None for s in plan.stages)
    with pytest.raises(NoFeasiblePlan, match="zb-h1: not measured"):
        _plan(1, schedule="zb-h1", split=False)


def test_interleaved_needs_micro_batches_a_multiple_of_the_groups() -> None:
    plan = _plan(2, micro=3)
    option = next(o for o in plan.schedules if o.schedule == "interleaved")
    assert not option.feasible and "not a multiple" in (option.reason or "")


def test_virtual_stages_asked_for_are_the_ones_planned() -> None:
    rng = random.Random(3)
    spec, clu = chain_spec(4), cluster(1, 4, SMALL_DEVICE)
    options = PlanOptions(strategies=["data"], schedule="interleaved", virtual_stages=2)
    space = enumerate_candidates(spec, clu, options)
    table = random_results(space, rng, tight=False, missing=0.0)
    plan = build_plan(spec, clu, options, space, table)
    assert plan.virtual_stages == 2 and len(plan.stages) == 2 * plan.num_device_groups
    assert [s.device_group for s in plan.stages] == [k % plan.num_device_groups for k in range(4)]


def test_plans_stored_before_read_as_1f1b() -> None:
    plan = _plan(0, schedule="1f1b")
    old = plan.model_dump(mode="json")
    for name in ("schedule_name", "virtual_stages", "peak_memory", "schedules"):
        old.pop(name)
    for stage in old["stages"]:
        for name in ("device_group", "input_grad_cost", "weight_cost", "schedule_memory"):
            stage.pop(name)
    for event in old["schedule"]:
        event.pop("device_group")
    back = Plan.model_validate(old)
    assert back.schedule_name == "1f1b" and back.virtual_stages == 1 and back.schedules == []
    assert all(e.group == e.stage for e in back.schedule)
    assert back.num_device_groups == len(back.stages)
