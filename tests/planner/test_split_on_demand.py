"""The split backward measured on demand (`schedule: auto`, `planner.split_estimate`).

Layer profiles are measured without the split (B and W); the zero-bubble schedule plans on
estimated splits, and a stage is measured split only when a plan that could be best needs
it. The reference is `build_plan` on the whole true table with every split measured (what
measuring every candidate with five modules would give)."""

import math

import pytest

from planner import EstimateSearch, build_plan, enumerate_candidates, with_layer_profiles
from planner.layer_profiles import is_profiled
from planner.split_estimate import PRIOR, is_split, split_ratios
from planner.table import Key
from schemas import ClusterSpec, ModuleKind, PlanOptions, StageProfileResult
from tests.planner.test_estimate_search import CLASSES, _spec
from tests.planner.test_estimate_search import _truth as plain_truth
from tests.support.profiles import fake_module

CLUSTER = ClusterSpec(num_hosts=1, devices_per_host=4)


def _options() -> PlanOptions:
    return PlanOptions(
        num_microbatches=8,
        config_space="data_parallel_only",
        strategies=["data"],
        schedule="auto",
        remat="as_written",
    )


def _truth(key: Key, devices: int, b_share: float, w_share: float) -> StageProfileResult:
    """The cost law of `test_estimate_search` (forward = overhead + the layers' times over
    the devices, backward twice that) with B and W `b_share` and `w_share` of the backward
    and a weight stash 60% of the activations."""
    plain = plain_truth(key, devices, {})
    backward = plain.backward_cost
    split = (
        fake_module(ModuleKind.backward_input, b_share * backward),
        fake_module(ModuleKind.backward_weight, w_share * backward),
    )
    return plain.model_copy(
        update={
            "module_profile_results": plain.module_profile_results + split,
            "weight_stash_size": 60 * plain.num_layers,
        }
    )


def _unsplit(result: StageProfileResult) -> StageProfileResult:
    """The result as measured without the split."""
    kept = tuple(
        m
        for m in result.module_profile_results
        if m.module in (ModuleKind.forward, ModuleKind.backward)
    )
    return result.model_copy(update={"module_profile_results": kept, "weight_stash_size": 0})


def _run(
    b_share: float, w_share: float
) -> tuple[EstimateSearch, dict[Key, StageProfileResult], list[Key]]:
    """The search measuring its layer profiles without the split; every stage a round asks
    for is measured with it. Returns the search, the truth and the stages measured split."""
    spec, options = _spec(), _options()
    space, scaled, _ = with_layer_profiles(
        enumerate_candidates(spec, CLUSTER, options), [x.fingerprint for x in spec.layers]
    )
    devices = [m.num_devices for m in space.submeshes]
    truth = {
        k.as_tuple(): _truth(k.as_tuple(), devices[k.submesh_id], b_share, w_share)
        for k in space.keys
    }
    search = EstimateSearch(spec, CLUSTER, options, space, frozenset(scaled), split_on_demand=True)
    for key in [k for k in truth if is_profiled(k, CLASSES)]:
        search.add([key], _unsplit(truth[key]))
    split: list[Key] = []
    while keys := search.next_round():
        for key in keys:
            split.append(key)
            search.add([key], truth[key])
    return search, truth, split


@pytest.mark.parametrize(
    ("b_share", "w_share", "zero_bubble"),
    [(0.45, 0.6, True), (1.0, 1.0, False)],  # a split twice the backward: zb-h1 loses
)
def test_the_search_measuring_the_split_on_demand_finds_the_exhaustive_optimum(
    b_share: float, w_share: float, zero_bubble: bool
) -> None:
    search, truth, split = _run(b_share, w_share)
    plan = search.plan()
    reference = build_plan(_spec(), CLUSTER, _options(), search.space, truth)
    assert (reference.schedule_name == "zb-h1") == zero_bubble
    assert plan.schedule_name == reference.schedule_name
    assert math.isclose(plan.predicted_iteration_time_s, reference.predicted_iteration_time_s)
    for stage in plan.stages:
        key = (stage.start, stage.end, stage.submesh_id, stage.config_id)
        measured = search.measured[key]
        assert is_split(measured) == (zero_bubble or key in split)
    profiles = [k for k in truth if is_profiled(k, CLASSES)]
    assert len(set(split) & set(profiles)) < len(profiles)  # not every profile split
    assert plan.search is not None
    again = {truth[k].fingerprint for k in split if k in profiles}
    assert plan.search.split_on_demand == len(again)  # layer profiles measured split again


def test_a_zero_bubble_plan_is_never_answered_on_an_estimated_split() -> None:
    search, _, split = _run(0.45, 0.6)
    assert split  # the zero-bubble plan's stages were measured split
    plan = search.plan()
    assert plan.schedule_name == "zb-h1"
    assert all(s.measured for s in plan.stages)
    assert all(
        not search.needs_split((s.start, s.end, s.submesh_id, s.config_id)) for s in plan.stages
    )


def test_split_ratios_are_the_medians_of_the_stages_measured_split() -> None:
    results = [_truth((0, 1, 0, 0), 1, 0.4, 0.7), _truth((2, 2, 0, 0), 1, 0.5, 0.5)]
    results.append(_unsplit(_truth((3, 3, 0, 0), 1, 0.9, 0.9)))  # not split: not counted
    ratios = split_ratios(results)
    assert math.isclose(ratios.input_grad, 0.45)
    assert math.isclose(ratios.weight_grad, 0.6)
    assert math.isclose(ratios.stash, 0.6)
    assert split_ratios(results[2:]) == PRIOR
