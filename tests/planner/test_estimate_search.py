"""The estimate search (planner.verify) against the exhaustive optimum on synthetic tables.

Every candidate's "true" result is made up by a cost law; the search sees only what it asks
to measure: the layer profiles first, then the stages each round asks for. The reference is
`build_plan` on the whole true table (what measuring every candidate would give)."""

import math
import sys

import pytest

from planner import EstimateSearch, build_plan, enumerate_candidates, with_layer_profiles
from planner.estimate import StageEstimator
from planner.layer_profiles import (
    REFERENCE,
    is_layer_profile,
    layer_profile_keys,
    on_demand_profiles,
)
from planner.table import Key
from planner.time_model import fit, predict
from schemas import ClusterSpec, ModelSpec, PlanOptions, StageProfileResult
from tests.planner.helpers import programless_chain_spec
from tests.support.profiles import fake_profile

CLUSTER = ClusterSpec(num_hosts=1, devices_per_host=4)
CLASSES = ["embed"] + ["block"] * 10 + ["head"]
COST = {"embed": 0.2e-3, "block": 1.0e-3, "head": 0.6e-3}
OVERHEAD = 0.15e-3


def _spec(classes: list[str] = CLASSES) -> ModelSpec:
    """A chain of layers whose fingerprints are `classes` (equal: identical layers)."""
    spec = programless_chain_spec(len(classes))
    pairs = zip(spec.layers, classes, strict=True)
    layers = [x.model_copy(update={"fingerprint": f}) for x, f in pairs]
    return spec.model_copy(update={"layers": layers})


def _options(schedule: str = "1f1b") -> PlanOptions:
    return PlanOptions(
        num_microbatches=8,
        config_space="data_parallel_only",
        strategies=["data"],
        schedule=schedule,  # type: ignore[arg-type]
        remat="as_written",
    )


def _truth(
    key: Key,
    devices: int,
    slower: dict[Key, float],
    classes: list[str] = CLASSES,
    scaling: float = 0.5,
) -> StageProfileResult:
    """The cost law: a per-call overhead plus each layer's time, split over the devices
    (time / devices ** scaling); times `slower[key]` for the stages made far off."""
    a, b, _, _ = key
    forward = OVERHEAD + sum(COST[c] for c in classes[a : b + 1]) / devices**scaling
    forward *= slower.get(key, 1.0)
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


def _run(
    schedule: str,
    slower: dict[Key, float] | None = None,
    classes: list[str] = CLASSES,
    scaling: float = 0.5,
) -> tuple[EstimateSearch, dict[Key, StageProfileResult], list[list[Key]]]:
    spec, options = _spec(classes), _options(schedule)
    space, scaled, _ = with_layer_profiles(
        enumerate_candidates(spec, CLUSTER, options), [x.fingerprint for x in spec.layers]
    )
    devices = [m.num_devices for m in space.submeshes]
    truth = {
        k.as_tuple(): _truth(k.as_tuple(), devices[k.submesh_id], slower or {}, classes, scaling)
        for k in space.keys
    }
    search = EstimateSearch(spec, CLUSTER, options, space, frozenset(scaled))
    for key in layer_profile_keys(space, classes, scaled):
        search.add([key], truth[key])
    rounds = []
    while keys := search.next_round():
        rounds.append(keys)
        for key in keys:
            search.add([key], truth[key])
    return search, truth, rounds


def _stages(plan_stages: list) -> list[Key]:  # type: ignore[type-arg]
    return [(s.start, s.end, s.submesh_id, s.config_id) for s in plan_stages]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "auto"])
def test_exact_estimates_give_the_exhaustive_optimum(schedule: str) -> None:
    search, truth, _ = _run(schedule)
    plan = search.plan()
    reference = build_plan(_spec(), CLUSTER, _options(schedule), search.space, truth)
    assert math.isclose(plan.predicted_iteration_time_s, reference.predicted_iteration_time_s)
    assert all(s.measured for s in plan.stages)
    assert plan.search is not None and plan.search.estimated > 0
    assert len(search.measured) < len(truth)  # it did not measure everything


def test_the_search_stops_with_measured_stages_only() -> None:
    search, _, rounds = _run("1f1b")
    plan = search.plan()
    assert all(_key in search.measured for _key in _stages(plan.stages))
    assert search.stopped == "the best plan is measured"
    assert search.rounds == len(rounds)


def test_a_far_off_estimate_is_measured_and_the_plan_changes() -> None:
    exact, _, _ = _run("1f1b")
    chosen = [k for k in _stages(exact.plan().stages) if not is_layer_profile(k)]
    assert chosen, "the exact plan should hold a stage longer than two layers"
    bad = chosen[0]
    search, truth, rounds = _run("1f1b", slower={bad: 3.0})
    plan = search.plan()
    assert bad in search.measured  # it was in the best plan on the estimates: measured
    assert any(bad in keys for keys in rounds)
    assert bad not in _stages(plan.stages)  # and, 3x slower than estimated, dropped
    reference = build_plan(_spec(), CLUSTER, _options(), search.space, truth)
    assert math.isclose(plan.predicted_iteration_time_s, reference.predicted_iteration_time_s)
    assert plan.search is not None and plan.search.estimate_error_max is not None
    assert plan.search.estimate_error_max > 0.5  # the far-off stage is in the reported error


def test_time_model_is_exact_on_its_own_law() -> None:
    classes = [0, 1, 1, 1, 2]
    mu = [0.2, 1.0, 0.6]

    def law(a: int, b: int) -> float:
        return 0.15 + sum(mu[c] for c in classes[a : b + 1])

    rows = [(a, b, law(a, b)) for a in range(5) for b in (a, a + 1) if b < 5]
    coef = fit(rows, classes, 3)
    assert coef is not None
    assert math.isclose(predict(coef, classes, 0, 4), law(0, 4), rel_tol=1e-9)
    assert math.isnan(predict(fit(rows[:1], classes, 3), classes, 0, 4))  # type: ignore[arg-type]


def test_layer_profiles_are_added_on_the_whole_cluster_only_where_cheaper() -> None:
    short = ["embed"] + ["block"] * 4 + ["head"]
    space = enumerate_candidates(_spec(short), CLUSTER, _options())
    whole = [m for m, s in enumerate(space.submeshes) if s.num_devices == 4]
    more, scaled, direct = with_layer_profiles(space, short)
    # 3 distinct layers and 2 distinct pairs of differing layers compile 7 layers, over 6
    assert scaled == [(0, 5, whole[0], 0)] and len(more.keys) == len(space.keys)
    assert not direct
    long = ["embed"] + ["block"] * 16 + ["head"]
    space = enumerate_candidates(_spec(long), CLUSTER, _options())
    more, scaled, _ = with_layer_profiles(space, long)
    added = {k.as_tuple() for k in more.keys} - {k.as_tuple() for k in space.keys}
    assert added and all(k[2] == whole[0] and is_layer_profile(k) for k in added)
    # every single; the boundaries of differing layers are the reference's (1 device)
    assert sorted((k[0], k[1]) for k in added) == [(i, i) for i in range(18)]
    # the whole model scaled, and its layers too until measured on demand
    assert sorted(scaled) == sorted([(0, 17, whole[0], 0), *added])
    assert {(0, 1, *REFERENCE), (16, 17, *REFERENCE)} <= {k.as_tuple() for k in more.keys}


def _measure_on_demand_profiles(search: EstimateSearch, truth: dict) -> None:
    """Measure the whole cluster's layer profiles the search left to measure on demand:
    its whole-model stages are then estimated from them, like every other stage."""
    lazy = [k for k in search.scaled if is_layer_profile(k) and k not in search.measured]
    assert lazy
    for key in lazy:
        search.add([key], truth[key])


def test_estimates_add_sizes_exactly() -> None:
    search, truth, _ = _run("1f1b")
    _measure_on_demand_profiles(search, truth)
    estimator: StageEstimator = search.estimator
    for key, true in truth.items():
        if key in search.measured:
            continue
        est = estimator.estimate(key)
        assert est is not None
        assert est.intermediate_size == true.intermediate_size
        assert est.initial_var_size == true.initial_var_size
        assert math.isclose(est.compute_cost, true.compute_cost, rel_tol=1e-6)


def test_the_table_of_estimates_equals_the_estimates_one_by_one() -> None:
    search, truth, _ = _run("auto")
    _measure_on_demand_profiles(search, truth)
    point = search.point_table()
    assert point.estimated
    for key in point.estimated:
        one = search.estimator.estimate(key)
        assert one is not None
        assert math.isclose(point.table.forward[key], one.forward_cost, rel_tol=1e-9)
        assert math.isclose(point.table.backward[key], one.backward_cost, rel_tol=1e-9)
        assert point.table.intermediate[key] == one.intermediate_size
        assert point.table.max_n_succ_stages[key] == one.max_n_succ_stages
        assert point.table.results[key].forward_cost == one.forward_cost


@pytest.mark.parametrize("scaling", [0.3, 1.0])
def test_the_whole_model_on_every_device_is_measured_when_it_could_be_best(
    scaling: float,
) -> None:
    """A short model: the whole-model stage on the 4 devices is estimated by scaling the 2
    devices' (the step 1 -> 2 devices' shortfall from perfect scaling carried to 2 -> 4),
    measured only when a plan that could be best holds it."""
    short = ["embed"] + ["block"] * 4 + ["head"]
    search, truth, _ = _run("1f1b", classes=short, scaling=scaling)
    (whole,) = search.scaled
    plan = search.plan()
    reference = build_plan(_spec(short), CLUSTER, _options(), search.space, truth)
    assert math.isclose(plan.predicted_iteration_time_s, reference.predicted_iteration_time_s)
    one_stage = _stages(reference.stages) == [whole]
    assert one_stage == (scaling == 1.0)  # perfect scaling: data parallelism wins
    assert (whole in search.measured) == one_stage  # poor scaling: seen, not measured
    # the cost law scales by the same factor per doubling (but its per-call overhead): the
    # estimate is the truth to within that overhead, a little below it
    if whole not in search.measured:
        point = search.point_table().table
        estimate = float(point.forward[whole] + point.backward[whole])
        assert 0.97 * truth[whole].compute_cost <= estimate <= truth[whole].compute_cost
    else:
        assert search.estimated_at_choice[whole] <= truth[whole].compute_cost


@pytest.mark.parametrize("scaling", [0.3, 1.0])
def test_the_whole_cluster_s_layers_are_measured_only_when_its_stage_could_be_best(
    scaling: float,
) -> None:
    """A model long enough for layer profiles on every device: they are not measured up
    front; when the scaled whole-model stage is in a plan that could be best, they are
    measured first (not the whole model), and the stage is measured only if its estimate
    from them still could be best. The plan is the full table's optimum either way."""
    search, truth, rounds = _run("1f1b", scaling=scaling)
    whole = [k for k in search.scaled if not is_layer_profile(k)]
    lazy = [k for k in search.scaled if is_layer_profile(k)]
    assert len(whole) == 1 and len(lazy) == len(CLASSES)
    plan = search.plan()
    reference = build_plan(_spec(), CLUSTER, _options(), search.space, truth)
    assert math.isclose(plan.predicted_iteration_time_s, reference.predicted_iteration_time_s)
    one_stage = _stages(reference.stages) == whole
    assert one_stage == (scaling == 1.0)  # perfect scaling: data parallelism wins
    asked = [k for keys in rounds for k in keys]
    if one_stage:
        assert asked.index(lazy[0]) < asked.index(whole[0])  # its layers first, then it
        assert search.estimator.profiled(*whole[0][2:])
    else:  # poor scaling: never near the best, neither it nor its layers measured
        assert not any(k in search.measured for k in [*whole, *lazy])


def test_one_device_measures_its_one_plan_directly() -> None:
    """A cluster of one device has one submesh, holding only the whole model: no smaller
    submesh to scale from, so the whole-model stage is measured directly."""
    short = ["embed"] + ["block"] * 4 + ["head"]
    one = ClusterSpec(num_hosts=1, devices_per_host=1)
    space = enumerate_candidates(_spec(short), one, _options())
    more, scaled, direct = with_layer_profiles(space, short)
    assert direct == [(0, 5, 0, 0)] and not scaled and len(more.keys) == len(space.keys)


def test_one_measured_whole_cluster_stage_corrects_the_scaling_of_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Several configs on every device, which scale far worse than the smaller submeshes
    did: once one is measured, the others' estimates carry that shortfall and are not
    measured one round each."""

    def three_strategies(schedule: str = "1f1b") -> PlanOptions:
        return PlanOptions(
            num_microbatches=8,
            strategies=["data", "megatron", "fsdp"],
            schedule=schedule,  # type: ignore[arg-type]
            remat="as_written",
        )

    monkeypatch.setattr(sys.modules[__name__], "_options", three_strategies)
    short = ["embed"] + ["block"] * 4 + ["head"]
    space = enumerate_candidates(_spec(short), CLUSTER, three_strategies())
    whole = [m for m, s in enumerate(space.submeshes) if s.num_devices == 4]
    slower = {(0, 5, m, c): 3.0 for m in whole for c in range(len(space.configs[m]))}
    search, truth, _ = _run("1f1b", slower=slower, classes=short, scaling=1.0)
    assert len(search.scaled) == 5
    measured = [k for k in search.scaled if k in search.measured]
    assert 1 <= len(measured) <= 2
    plan = search.plan()
    reference = build_plan(_spec(short), CLUSTER, three_strategies(), search.space, truth)
    assert math.isclose(plan.predicted_iteration_time_s, reference.predicted_iteration_time_s)


def test_only_a_whole_model_with_every_layer_on_demand_is_measured_through_its_layers() -> None:
    whole, m = (0, 3, 2, 0), (2, 0)
    singles = [(a, a, *m) for a in range(4)]
    assert on_demand_profiles(whole, {whole, *singles}) == singles
    outside_only = [singles[0], singles[3]]  # the layers outside the pipeline, not a profile set
    assert on_demand_profiles(whole, {whole, *outside_only}) == []
    assert on_demand_profiles(singles[1], set(singles)) == []
