"""Pruning never changes the optimum: skipped candidates could not be in a better plan."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import (
    StagePruner,
    baseline_keys,
    baseline_plans,
    build_cost_table,
    enumerate_candidates,
    range_lower_bounds,
    training_dp,
)
from schemas import PlanOptions
from tests.planner.helpers import cluster, programless_chain_spec, result


def test_lower_bounds_are_the_largest_measured_subrange() -> None:
    measured = np.zeros((3, 3, 1, 1))
    measured[0, 0] = 2.0
    measured[1, 2] = 5.0
    bound = range_lower_bounds(measured)
    assert bound[0, 0, 0, 0] == 2.0 and bound[0, 1, 0, 0] == 2.0
    assert bound[0, 2, 0, 0] == 5.0 and bound[1, 1, 0, 0] == 0.0


@settings(max_examples=25, deadline=None)
@given(
    num_layers=st.integers(2, 7),
    devices=st.sampled_from([2, 4]),
    microbatches=st.integers(1, 16),
    seed=st.integers(0, 10_000),
)
def test_pruned_search_finds_the_full_optimum(
    num_layers: int, devices: int, microbatches: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    spec = programless_chain_spec(num_layers)
    cl = cluster(devices_per_host=devices)
    options = PlanOptions(num_microbatches=microbatches)
    space = enumerate_candidates(spec, cl, options)
    layer_cost = rng.uniform(0.1, 1.0, size=num_layers)
    scale = {
        (m, c): (rng.uniform(0.3, 1.5), rng.uniform(0.0, 0.5))
        for m in range(len(space.submeshes))
        for c in range(len(space.configs[m]))
    }

    def cost(k: tuple[int, int, int, int]) -> float:  # monotone in the layer range
        a, b, m, c = k
        factor, overhead = scale[(m, c)]
        return float(layer_cost[a : b + 1].sum() * factor + overhead)

    keys = [k.as_tuple() for k in space.keys]
    full = {
        k: result(*space.resolve(k), cost(k) / 3, 2 * cost(k) / 3, max_n_succ_stages=2**20)
        for k in keys
    }
    sizes = [s.as_tuple() for s in space.submeshes]
    table = build_cost_table(spec, cl, space, full)
    best = training_dp(table.dp_cost, None, sizes, devices, microbatches)

    pruner = StagePruner(spec, cl, options, space, margin=0.0)
    skipped = 0
    for k in sorted(keys, key=lambda k: (k[1] - k[0], -space.submeshes[k[2]].num_devices)):
        if pruner.prunable([k]):
            skipped += 1
        else:
            pruner.add([k], full[k])
    assert np.isclose(pruner.upper_bound, best.cost, rtol=1e-9)
    assert skipped + len(pruner.results) == len(keys)


def test_baseline_stages_are_never_pruned() -> None:
    spec = programless_chain_spec(8)
    cl = cluster(devices_per_host=4)
    options = PlanOptions(num_microbatches=8)
    space = enumerate_candidates(spec, cl, options)
    keep = baseline_keys(spec.num_layers, space, cl.num_devices)
    whole = [m for m, s in enumerate(space.submeshes) if s.num_devices == 4][0]
    assert (0, 7, whole, 0) in keep  # data parallel on the whole cluster
    assert {(0, 3), (4, 7)} <= {(a, b) for a, b, _, _ in keep}  # uniform_2
    pruner = StagePruner(spec, cl, options, space, margin=0.0, keep=keep)
    for k in sorted((k.as_tuple() for k in space.keys), key=lambda k: k[1] - k[0]):
        if not pruner.prunable([k]):
            a, b, m, _ = k
            pruner.add([k], result(*space.resolve(k), 0.01 * (b - a + 1), 0.02 * (b - a + 1)))
    assert keep <= set(pruner.results)
    table = build_cost_table(spec, cl, space, pruner.results)
    assert all(b.iteration_time_s is not None for b in baseline_plans(spec, space, table, 4, 8))
    assert len(pruner.results) < len(space.keys)  # something was pruned all the same
