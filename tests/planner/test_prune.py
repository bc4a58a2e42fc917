"""Pruning never changes the optimum: skipped candidates could not be in a better plan."""

import base64

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import (
    StagePruner,
    build_cost_table,
    enumerate_candidates,
    range_lower_bounds,
    training_dp,
)
from schemas import (
    ClusterSpec,
    LayerSpec,
    ModelSpec,
    ModuleKind,
    ModuleProfileResult,
    PlanOptions,
    StageProfileResult,
    VarSpec,
)


def chain_spec(num_layers: int) -> ModelSpec:
    """A chain of layers x -> h0 -> ... -> loss; programs are opaque (no jax here)."""
    prog = base64.b64encode(b"opaque").decode()
    layers, prev = [], VarSpec(name="x", shape=(8, 4), dtype="float32")
    for i in range(num_layers):
        last = i == num_layers - 1
        out = VarSpec(
            name="loss" if last else f"h{i}", shape=() if last else (8, 4), dtype="float32"
        )
        layers.append(
            LayerSpec(
                name=f"l{i}",
                inputs=[prev],
                outputs=[out],
                program=prog,
                flops=1.0,
                fingerprint=f"f{i}",
            )
        )
        prev = out
    return ModelSpec(
        inputs=[VarSpec(name="x", shape=(8, 4), dtype="float32")], layers=layers, loss="loss"
    )


def timed(key: tuple[int, int, int, int], seconds: float) -> StageProfileResult:
    def module(kind: ModuleKind, t: float) -> ModuleProfileResult:
        return ModuleProfileResult(
            module=kind,
            compute_cost=t,
            peak_memory=0,
            temp_buffer_size=0,
            invar_names=(),
            outvar_names=(),
            invar_sizes=(),
            outvar_sizes=(),
            donated_invars=(),
            available_memory=2**30,
        )

    from schemas import ShardingConfig, SubmeshShape

    return StageProfileResult(
        status="ok",
        fingerprint=str(key),
        submesh=SubmeshShape(hosts=1, devices_per_host=1),
        config=ShardingConfig(logical_mesh=(1, 1), strategy="data"),
        num_layers=1,
        module_profile_results=(
            module(ModuleKind.forward, seconds / 3),
            module(ModuleKind.backward, 2 * seconds / 3),
        ),
        available_memory=2**30,
        max_n_succ_stages=2**20,
    )


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
    spec = chain_spec(num_layers)
    cluster = ClusterSpec(num_hosts=1, devices_per_host=devices)
    options = PlanOptions(num_microbatches=microbatches, global_batch_size=8 * microbatches)
    space = enumerate_candidates(spec, cluster, options)
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
    full = {k: timed(k, cost(k)) for k in keys}
    sizes = [s.as_tuple() for s in space.submeshes]
    table = build_cost_table(spec, cluster, space, full)
    best = training_dp(table.dp_cost, None, sizes, devices, microbatches)

    pruner = StagePruner(spec, cluster, options, space, margin=0.0)
    skipped = 0
    for k in sorted(keys, key=lambda k: (k[1] - k[0], -space.submeshes[k[2]].num_devices)):
        if pruner.prunable([k]):
            skipped += 1
        else:
            pruner.add([k], full[k])
    assert np.isclose(pruner.upper_bound, best.cost, rtol=1e-9)
    assert skipped + len(pruner.results) == len(keys)
