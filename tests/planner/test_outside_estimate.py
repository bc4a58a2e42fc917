"""The layers outside the pipeline through the estimate search: their one-layer stages on
every device are ranked at their scaling bound (not measured up front with the layer
profiles) and measured only when a plan within the band holds one. The answer must equal the
plan of the whole true table (every candidate measured), its outside layers measured."""

import pytest

from planner import (
    CandidateSpace,
    EstimateSearch,
    build_plan,
    enumerate_candidates,
    with_layer_profiles,
    with_layers_outside,
)
from planner.layer_profiles import is_profiled
from planner.table import Key
from schemas import ModelSpec, PlanOptions, StageProfileResult
from tests.planner.helpers import cluster
from tests.planner.test_outside import COST, EXPONENT, MEMORY, _spec
from tests.support.profiles import fake_profile

# Short models, as `make demo`'s: the whole cluster holds no layer profiles of its own
# (`with_layer_profiles` scales its whole-model stages), so the outside stages are new there.
GPT = ["embed"] + ["block"] * 4 + ["head"]
CHEAP_ENDS = ["embed"] + ["block"] * 4 + ["embed"]


def _options() -> PlanOptions:
    return PlanOptions(
        num_microbatches=8,
        strategies=["data", "megatron"],
        schedule="1f1b",
        remat="as_written",
    )


def _truth(spec: ModelSpec, space: CandidateSpace, key: Key) -> StageProfileResult:
    """A stage's layers' cost over its devices (`EXPONENT`), a little more under tensor
    parallelism, plus a per-stage overhead."""
    a, b, m, c = key
    submesh, config = space.submeshes[m], space.configs[m][c]
    n = submesh.num_devices
    tp = config.logical_mesh[1]
    layers = spec.layers[a : b + 1]
    forward = 0.2e-3 + sum(COST[x.fingerprint] / n ** EXPONENT[x.fingerprint] for x in layers)
    forward *= 1.0 + 0.1 * (tp - 1)
    inter = 100 * len(layers)
    return fake_profile(
        f"{key}",
        forward=forward,
        backward=2 * forward,
        submesh=submesh,
        config=config,
        num_layers=len(layers),
        peak=1000,
        initial_var_size=400,
        intermediate_size=inter,
        available_memory=MEMORY,
        max_n_succ_stages=min(2**20, (MEMORY - 1400) // inter - 1),
    )


@pytest.mark.parametrize("classes", [GPT, CHEAP_ENDS])
def test_outside_layers_are_measured_only_where_a_plan_needs_them(classes: list[str]) -> None:
    spec, options, clus = _spec(classes), _options(), cluster(1, 4)
    fps = [x.fingerprint for x in spec.layers]
    space, scaled, _ = with_layer_profiles(enumerate_candidates(spec, clus, options), fps)
    before = {k.as_tuple() for k in space.keys}
    space = with_layers_outside(space, spec, clus.num_devices)
    outside = [k.as_tuple() for k in space.keys if k.as_tuple() not in before]
    assert outside and all(is_profiled(k, fps) for k in outside)  # one-layer stages
    truth = {k.as_tuple(): _truth(spec, space, k.as_tuple()) for k in space.keys}
    reference = build_plan(spec, clus, options, space, truth)

    search = EstimateSearch(spec, clus, options, space, frozenset([*scaled, *outside]))
    for key in [k for k in truth if is_profiled(k, fps) and k not in outside]:
        search.add([key], truth[key])
    while keys := search.next_round():
        for key in keys:
            search.add([key], truth[key])
    plan = search.plan()

    assert plan.predicted_iteration_time_s == pytest.approx(
        reference.predicted_iteration_time_s, rel=1e-9
    )
    assert [s.layer_names for s in plan.outside] == [s.layer_names for s in reference.outside]
    on_all = [(s.start, s.end, s.submesh_id, s.config_id) for s in plan.outside]
    assert all(k in search.measured for k in on_all)  # measured, not scaled
    measured = sum(k in search.measured for k in outside)
    if classes == GPT:  # the head is cheaper on all devices (test_outside): outside
        assert plan.outside
    else:  # cheap ends stay in the pipeline: some outside stages are never measured
        assert plan.outside == [] and measured < len(outside)
