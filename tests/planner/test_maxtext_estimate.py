"""`target: maxtext` through the estimate search, against a brute force over the whole true
table of every MaxText-expressible plan (uniform chunks of the blocks on one submesh and
config, GPipe or circular, micro-batches a multiple of the stages; embedding and head on all
devices outside the pipeline).

Every candidate's "true" result comes from a cost law; the search sees only what it asks to
measure (the layer profiles first, then the stages each round asks for). The MaxText settings
answered obey MaxText's own constraints (`check_maxtext_constraints`), which
`src/MaxText/configs/types.py` checks when pipelining, read at AI-Hypercomputer/maxtext
@ 0035497a3061c509c853bdb5b8f3322e3cb7d696 (as at 1007fc2a): stages x repeats x layers per
stage = pipeline_parallel_layers, micro-batches a multiple of the stages, and the product of
the ici_* / dcn_* axes = the devices per host / the hosts."""

import math

import pytest

from planner import EstimateSearch, enumerate_candidates, simulate, with_layer_profiles
from planner.layer_profiles import is_profiled
from planner.table import Key
from schemas import ClusterSpec, ModelSpec, PlanOptions, StageProfileResult
from tests.planner.helpers import programless_chain_spec
from tests.planner.test_trainers import check_maxtext_constraints
from tests.support.profiles import fake_profile

COST = {"embed": 0.3e-3, "block": 1.0e-3, "head": 0.9e-3}
OVERHEAD = 0.2e-3


def _spec(blocks: int) -> ModelSpec:
    classes = ["embed"] + ["block"] * blocks + ["head"]
    spec = programless_chain_spec(len(classes))
    layers = [
        x.model_copy(update={"fingerprint": f}) for x, f in zip(spec.layers, classes, strict=True)
    ]
    return spec.model_copy(update={"layers": layers})


def _options(micro: int, schedule: str) -> PlanOptions:
    return PlanOptions(
        num_microbatches=micro,
        strategies=["data", "megatron"],
        schedule=schedule,  # type: ignore[arg-type]
        remat="as_written",
        target="maxtext",
    )


def _truth(spec: ModelSpec, key: Key, devices: int, tp: int) -> StageProfileResult:
    """A per-call overhead plus each layer's time over its devices (tensor parallelism
    scales worse and costs a little per layer: the configs differ)."""
    a, b, _, _ = key
    work = sum(COST[x.fingerprint] for x in spec.layers[a : b + 1])
    forward = OVERHEAD + work / devices ** (0.8 if tp == 1 else 0.6) + 0.05e-3 * (tp - 1)
    n = b - a + 1
    return fake_profile(
        f"{key}",
        forward=forward,
        backward=2 * forward,
        num_layers=n,
        initial_var_size=400 * n,
        intermediate_size=100 * n,
        max_n_succ_stages=100,
    )


def _brute_force(
    spec: ModelSpec, cluster: ClusterSpec, truth: dict[Key, StageProfileResult], space, micro: int
) -> tuple[float, list[Key]]:
    """The fastest MaxText plan on the whole true table: every submesh, config and repeat
    count, each simulated; the layers outside the blocks at their fastest one-layer stage
    on the largest submesh that has one, over all devices."""
    devices = cluster.num_devices
    first, last = 1, spec.num_layers - 2
    blocks = last - first + 1
    outside = 0.0
    for i in (0, spec.num_layers - 1):
        sizes = sorted({m.num_devices for m in space.submeshes}, reverse=True)
        for size in sizes:
            times = [
                (r.compute_cost, space.submeshes[k[2]].num_devices)
                for k, r in truth.items()
                if k[:2] == (i, i) and space.submeshes[k[2]].num_devices == size
            ]
            if times:
                t, n = min(times)
                outside += t * n / devices * micro
                break
    best: tuple[float, list[Key]] = (math.inf, [])
    for m, sub in enumerate(space.submeshes):
        stages = devices // sub.num_devices
        if stages < 2 or micro % stages:
            continue
        for c in range(len(space.configs[m])):
            for repeats in range(1, blocks + 1):
                chunks = stages * repeats
                if blocks % chunks:
                    continue
                size = blocks // chunks
                keys = [(first + j * size, first + (j + 1) * size - 1, m, c) for j in range(chunks)]
                forward = [truth[k].module_profile_results[0].compute_cost for k in keys]
                backward = [truth[k].module_profile_results[1].compute_cost for k in keys]
                name = "gpipe" if repeats == 1 else "interleaved"
                time = simulate(name, forward, backward, micro, None, stages).iteration_time_s
                if time + outside < best[0]:
                    best = (time + outside, keys)
    return best


@pytest.mark.parametrize(
    ("blocks", "micro", "schedule"), [(8, 8, "auto"), (6, 4, "1f1b"), (8, 4, "gpipe")]
)
def test_maxtext_by_estimates_equals_the_brute_force(
    blocks: int, micro: int, schedule: str
) -> None:
    spec, cluster = _spec(blocks), ClusterSpec(num_hosts=1, devices_per_host=4)
    options = _options(micro, schedule)
    fps = [x.fingerprint for x in spec.layers]
    space, scaled, _ = with_layer_profiles(enumerate_candidates(spec, cluster, options), fps)
    truth = {}
    for k in space.keys:
        submesh, config = space.resolve(k)
        truth[k.as_tuple()] = _truth(
            spec, k.as_tuple(), submesh.num_devices, config.logical_mesh[1]
        )
    search = EstimateSearch(spec, cluster, options, space, frozenset(scaled))
    for key in [k for k in truth if is_profiled(k, fps)]:
        search.add([key], truth[key])
    while keys := search.next_round():
        for key in keys:
            search.add([key], truth[key])
    plan = search.plan()
    mt = plan.maxtext
    assert mt is not None and mt.feasible, mt
    best_time, best_keys = _brute_force(spec, cluster, truth, space, micro)
    assert mt.predicted_iteration_time_s == pytest.approx(best_time, rel=1e-9)
    assert mt.chunks == [(k[0], k[1]) for k in best_keys]
    m, c = best_keys[0][2], best_keys[0][3]
    assert mt.submesh == space.submeshes[m] and mt.config == space.configs[m][c]
    assert all(k in search.measured for k in best_keys)  # verified, not estimated
    assert len(search.measured) < len(truth)  # it did not measure everything
    check_maxtext_constraints(mt.settings, 1, 4)
    assert mt.settings["num_pipeline_microbatches"] == micro
    assert mt.settings["pipeline_parallel_layers"] == blocks
