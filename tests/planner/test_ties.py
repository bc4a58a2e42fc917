"""Deterministic ties and the runner-up: one table gives one plan, whatever the input order.

Tables with costs drawn from a few small integers are full of exact ties. The DP must return
the optimum (brute force), and among the optimal plans the first in its documented order:
fewer stages, then the stages lexicographically by (start, end, submesh shape rank, config
rank). Permuting the submesh list and each submesh's configs (with the cost tensor and the
config ranks permuted alike) must give the same plan, named by what its stages are.
"""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import inference_dp, runner_up_dp, training_dp
from planner.dp import pipeline_cost
from planner.ranks import REL_TIE, plan_order_key, submesh_ranks
from planner.reference import runner_up_by_exclusion
from tests.planner.brute_force import all_plans

SUBMESH_SETS = [
    [(1, 1)],
    [(1, 1), (1, 2)],
    [(1, 2), (1, 1)],
    [(1, 1), (1, 2), (1, 4)],
    [(1, 1), (1, 2), (2, 2)],
    [(2, 1), (1, 2), (1, 1)],
    [(1, 2), (1, 3)],
]


@st.composite
def tied_tables(draw: st.DrawFn, memory: bool = True) -> dict:
    """A small table whose costs are a few integers (or missing): many exact ties."""
    num_layers = draw(st.integers(1, 5))
    submeshes = draw(st.sampled_from(SUBMESH_SETS))
    num_configs = draw(st.integers(1, 3))
    shape = (num_layers, num_layers, len(submeshes), num_configs)
    size = int(np.prod(shape))
    values = st.sampled_from([1.0, 2.0, 2.0, 3.0, math.inf])
    cost = np.array(draw(st.lists(values, min_size=size, max_size=size))).reshape(shape)
    mns = None
    if memory and draw(st.booleans()):
        limits = draw(st.lists(st.integers(-1, 3), min_size=size, max_size=size))
        mns = np.array(limits).reshape(shape)
    # the configs' identities: distinct ranks in a random order per submesh
    ranks = np.array([draw(st.permutations(range(num_configs))) for _ in submeshes], dtype=np.int64)
    return {
        "cost": cost,
        "mns": mns,
        "submeshes": submeshes,
        "sizes": [h * d for h, d in submeshes],
        "devices": draw(st.integers(1, 5)),
        "microbatches": draw(st.integers(1, 6)),
        "ranks": ranks,
    }


def feasible_plans(inst: dict, memory_rule: str = "training") -> list[list[tuple]]:
    """Every plan the DP may return (memory rule as `training_dp` or `inference_dp`)."""
    out = []
    for plan in all_plans(inst["cost"], inst["sizes"], inst["devices"]):
        mns, n = inst["mns"], len(plan)
        if mns is not None:
            if memory_rule == "training" and any(n - 1 - p > mns[s] for p, s in enumerate(plan)):
                continue
            if memory_rule == "inference" and any(mns[s] < 0 for s in plan):
                continue
        out.append(plan)
    return out


def order_key(inst: dict, plan: list[tuple]) -> tuple:
    return plan_order_key(plan, submesh_ranks(inst["submeshes"]), inst["ranks"])


def objective(inst: dict, plan: list[tuple]) -> float:
    return pipeline_cost([float(inst["cost"][s]) for s in plan], inst["microbatches"])


def first_of_best(inst: dict, plans: list[list[tuple]], value) -> tuple[float, list[tuple]]:
    """The least value and, among the plans tied with it, the first in the DP's order."""
    if not plans:
        return math.inf, []
    best = min(value(p) for p in plans)
    tied = [p for p in plans if value(p) <= best + REL_TIE * best]
    return best, min(tied, key=lambda p: order_key(inst, p))


def identity(inst: dict, plan: list[tuple]) -> list[tuple]:
    """A plan named by what its stages are: (start, end, submesh shape, config identity)."""
    return [(a, b, inst["submeshes"][m], int(inst["ranks"][m, c])) for a, b, m, c in plan]


def permuted(inst: dict, sub_perm: list[int], cfg_perms: list[list[int]]) -> dict:
    """The same table with submesh `sub_perm[j]` given as the j-th, and its configs in the
    order `cfg_perms[j]`."""
    cost, mns, ranks = inst["cost"], inst["mns"], inst["ranks"]
    new_cost = np.empty_like(cost)
    new_mns = None if mns is None else np.empty_like(mns)
    new_ranks = np.empty_like(ranks)
    for j, m in enumerate(sub_perm):
        new_cost[:, :, j, :] = cost[:, :, m, cfg_perms[j]]
        if mns is not None:
            new_mns[:, :, j, :] = mns[:, :, m, cfg_perms[j]]
        new_ranks[j] = ranks[m, cfg_perms[j]]
    submeshes = [inst["submeshes"][m] for m in sub_perm]
    return {
        **inst,
        "cost": new_cost,
        "mns": new_mns,
        "ranks": new_ranks,
        "submeshes": submeshes,
        "sizes": [h * d for h, d in submeshes],
    }


def solve(inst: dict):
    return training_dp(
        inst["cost"],
        inst["mns"],
        inst["submeshes"],
        inst["devices"],
        inst["microbatches"],
        config_rank=inst["ranks"],
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tied_tables())
def test_training_dp_picks_the_first_optimal_plan_in_its_order(inst: dict) -> None:
    plans = feasible_plans(inst)
    best, expected = first_of_best(inst, plans, lambda p: objective(inst, p))
    result = solve(inst)
    assert result.cost == best
    assert result.stages == expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tied_tables(), st.data())
def test_training_dp_gives_the_same_plan_under_permuted_input_order(
    inst: dict, data: st.DataObject
) -> None:
    num_subs, num_cfgs = len(inst["submeshes"]), inst["cost"].shape[3]
    sub_perm = data.draw(st.permutations(range(num_subs)))
    cfg_perms = [data.draw(st.permutations(range(num_cfgs))) for _ in range(num_subs)]
    other = permuted(inst, list(sub_perm), [list(p) for p in cfg_perms])
    first, second = solve(inst), solve(other)
    best, expected = first_of_best(inst, feasible_plans(inst), lambda p: objective(inst, p))
    assert first.cost == second.cost == best
    assert first.stages == expected
    assert identity(inst, first.stages) == identity(other, second.stages)
    runner_a = runner_up_dp(
        inst["cost"], inst["mns"], inst["submeshes"], inst["devices"], inst["microbatches"],
        first.stages, config_rank=inst["ranks"],
    )  # fmt: skip
    runner_b = runner_up_dp(
        other["cost"], other["mns"], other["submeshes"], other["devices"],
        other["microbatches"], second.stages, config_rank=other["ranks"],
    )  # fmt: skip
    assert runner_a.cost == runner_b.cost
    assert identity(inst, runner_a.stages) == identity(other, runner_b.stages)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tied_tables())
def test_runner_up_is_the_best_other_plan(inst: dict) -> None:
    chosen = solve(inst)
    result = runner_up_dp(
        inst["cost"],
        inst["mns"],
        inst["submeshes"],
        inst["devices"],
        inst["microbatches"],
        chosen.stages,
        config_rank=inst["ranks"],
    )
    others = [p for p in feasible_plans(inst) if p != chosen.stages]
    best, expected = first_of_best(inst, others, lambda p: objective(inst, p))
    assert result.cost == best
    assert result.stages == expected
    args = (inst["cost"], inst["mns"], inst["submeshes"], inst["devices"], inst["microbatches"])
    by_exclusion = runner_up_by_exclusion(*args, chosen.stages, config_rank=inst["ranks"])
    assert by_exclusion.cost == best and by_exclusion.stages == expected
    if not chosen.feasible:
        assert not result.feasible
    elif result.feasible:
        assert result.cost >= chosen.cost and result.stages != chosen.stages


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tied_tables())
def test_inference_dp_ties_least_max_then_least_sum_then_order(inst: dict) -> None:
    plans = feasible_plans(inst, "inference")
    result = inference_dp(
        inst["cost"], inst["mns"], inst["submeshes"], inst["devices"], config_rank=inst["ranks"]
    )
    if not plans:
        assert not result.feasible
        return
    costs = {id(p): [float(inst["cost"][s]) for s in p] for p in plans}
    least_max = min(max(c) for c in costs.values())
    bottleneck = [p for p in plans if max(costs[id(p)]) == least_max]
    _, expected = first_of_best(inst, bottleneck, lambda p: sum(costs[id(p)]))
    assert result.cost == least_max and result.stages == expected


def test_fewer_stages_win_a_tie() -> None:
    # 2 layers: two stages of 1 s on one device each, or one stage on both devices.
    cost = np.full((2, 2, 2, 1), np.inf)
    cost[0, 0, 0, 0] = cost[1, 1, 0, 0] = 1.0
    cost[0, 1, 1, 0] = 1.25  # 2 + 3 * 1 = 5 = 4 * 1.25
    result = training_dp(cost, None, [(1, 1), (1, 2)], 2, 4)
    assert result.stages == [(0, 1, 1, 0)] and result.cost == 5.0
    # the same with the submeshes given the other way round
    result = training_dp(cost[:, :, ::-1], None, [(1, 2), (1, 1)], 2, 4)
    assert result.stages == [(0, 1, 0, 0)]


@pytest.mark.parametrize("microbatches", [1, 4])
def test_objectives_within_rel_tie_are_tied(microbatches: int) -> None:
    # The one-stage plan is 1e-14 (relative) more expensive: a tie, which fewer stages win.
    cost = np.full((2, 2, 2, 1), np.inf)
    cost[0, 0, 0, 0] = cost[1, 1, 0, 0] = 1.0
    two_stages = 2.0 + (microbatches - 1) * 1.0
    cost[0, 1, 1, 0] = two_stages / microbatches * (1 + 1e-14)
    result = training_dp(cost, None, [(1, 1), (1, 2)], 2, microbatches)
    assert result.stages == [(0, 1, 1, 0)]
    cost[0, 1, 1, 0] = two_stages / microbatches * (1 + 1e-9)  # no longer a tie
    result = training_dp(cost, None, [(1, 1), (1, 2)], 2, microbatches)
    assert result.stages == [(0, 0, 0, 0), (1, 1, 0, 0)]


def test_equal_configs_go_by_config_rank() -> None:
    cost = np.full((1, 1, 1, 3), 2.0)
    assert training_dp(cost, None, [(1, 1)], 1, 2).stages == [(0, 0, 0, 0)]
    ranks = np.array([[2, 0, 1]])
    assert training_dp(cost, None, [(1, 1)], 1, 2, config_rank=ranks).stages == [(0, 0, 0, 1)]
    with pytest.raises(ValueError, match="config_rank has shape"):
        training_dp(cost, None, [(1, 1)], 1, 2, config_rank=np.zeros((1, 2)))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tied_tables(), st.randoms(use_true_random=False))
def test_runner_up_of_any_feasible_plan(inst: dict, rng) -> None:
    """Not only of the DP's plan: of any feasible plan, e.g. one with a costlier config."""
    plans = feasible_plans(inst)
    if not plans:
        return
    given = rng.choice(plans)
    result = runner_up_dp(
        inst["cost"], inst["mns"], inst["submeshes"], inst["devices"], inst["microbatches"],
        given, config_rank=inst["ranks"],
    )  # fmt: skip
    others = [p for p in plans if p != given]
    best, expected = first_of_best(inst, others, lambda p: objective(inst, p))
    assert result.cost == best and result.stages == expected


def test_runner_up_of_the_only_plan_is_none() -> None:
    cost = np.full((1, 1, 1, 1), 3.0)
    chosen = training_dp(cost, None, [(1, 1)], 1, 2)
    result = runner_up_dp(cost, None, [(1, 1)], 1, 2, chosen.stages)
    assert not result.feasible and result.stages == []
