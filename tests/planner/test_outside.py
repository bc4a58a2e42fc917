"""The unrestricted search's choice to run the layers around the repeated blocks (embedding,
head) on every device outside the pipeline, as MaxText does, costed from their measured
one-layer stages on all devices.

The reference: the best plan of the blocks alone (a model of the blocks only, planned with
the choice off) plus the outside layers' measured time × B, against the best plan with every
layer in the pipeline; the search must answer the faster."""

import math

import pytest

from planner import build_plan, enumerate_candidates, with_layers_outside
from schemas import ModelSpec, PlanOptions
from schemas.trainer_export import ExportUnavailable, export_plan
from tests.planner.helpers import cluster
from tests.planner.helpers import programless_chain_spec as chain_spec
from tests.support.profiles import fake_profile

MEMORY = cluster(1, 4).device_memory_bytes  # a stage's room is judged on the job's devices


def _spec(classes: list[str]) -> ModelSpec:
    spec = chain_spec(len(classes))
    layers = [
        x.model_copy(update={"name": f"{c}{i}", "fingerprint": c})
        for i, (x, c) in enumerate(zip(spec.layers, classes, strict=True))
    ]
    return spec.model_copy(update={"layers": layers})


GPT = ["embed"] + ["block"] * 6 + ["head"]
COST = {"embed": 0.5e-3, "block": 1.0e-3, "head": 12.0e-3}  # a large vocabulary
# how a layer's time falls with its stage's devices: time / devices ** EXPONENT (the
# embedding and head, batch-parallel, scale perfectly; the blocks do not)
EXPONENT = {"embed": 1.0, "block": 0.5, "head": 1.0}


def _table(spec: ModelSpec, options: PlanOptions, stash: int = 100) -> tuple[object, dict]:
    """Every candidate (and the outside layers' one-layer stages on all devices) measured:
    a stage's layers' cost over its devices (`EXPONENT`) plus a per-stage overhead;
    `stash` bytes per micro-batch per layer."""
    clus = cluster(1, 4)
    space = enumerate_candidates(spec, clus, options)
    if options.allows_outside:
        space = with_layers_outside(space, spec, clus.num_devices)
    results = {}
    for key in space.keys:
        submesh, config = space.resolve(key)
        n = submesh.num_devices
        layers = spec.layers[key.start : key.end + 1]
        forward = 0.2e-3 + sum(COST[x.fingerprint] / n ** EXPONENT[x.fingerprint] for x in layers)
        count = len(layers)
        inter = stash * count
        results[key.as_tuple()] = fake_profile(
            f"{key.as_tuple()}",
            forward=forward,
            backward=2 * forward,
            submesh=submesh,
            config=config,
            num_layers=count,
            peak=1000,
            initial_var_size=400,
            intermediate_size=inter,
            available_memory=MEMORY,
            max_n_succ_stages=min(2**20, (MEMORY - 1400) // inter - 1),
        )
    return space, results


def _options(**kw: object) -> PlanOptions:
    base: dict[str, object] = {
        "num_microbatches": 8,
        "config_space": "data_parallel_only",
        "strategies": ["data"],
        "schedule": "1f1b",
        "remat": "as_written",
    }
    return PlanOptions(**(base | kw))


def _reference(classes: list[str], stash: int = 100) -> tuple[float, float]:
    """(the best plan with every layer in the pipeline, the best plan of the blocks alone +
    the outside layers' time on all devices × B, inf when one does not hold B micro-batches)."""
    spec, off = _spec(classes), _options(outside_layers=False)
    space, results = _table(spec, off, stash)
    inside = build_plan(spec, cluster(1, 4), off, space, results).predicted_iteration_time_s
    first = classes.index("block")
    last = len(classes) - 1 - classes[::-1].index("block")
    blocks = _spec(classes[first : last + 1])
    b_space, b_results = _table(blocks, off, stash)
    pipeline = build_plan(blocks, cluster(1, 4), off, b_space, b_results)
    outside = 0.0
    for name in classes[:first] + classes[last + 1 :]:
        forward = 0.2e-3 + COST[name] / 4 ** EXPONENT[name]
        holds = (MEMORY - 1400) // stash - 1 >= 7
        outside += 3 * forward * 8 if holds else math.inf
    return inside, pipeline.predicted_iteration_time_s + outside


def test_the_faster_of_inside_and_outside_is_chosen() -> None:
    spec, options = _spec(GPT), _options()
    space, results = _table(spec, options)
    plan = build_plan(spec, cluster(1, 4), options, space, results)
    inside, outside = _reference(GPT)
    assert outside < inside  # the head pipelined costs a stage more than all devices do
    assert plan.predicted_iteration_time_s == pytest.approx(outside, rel=1e-9)
    assert [s.layer_names for s in plan.outside] == [["embed0"], ["head7"]]
    assert all(s.submesh.num_devices == 4 for s in plan.outside)
    assert plan.stages[0].start == 1 and plan.stages[-1].end == 6
    by_hand = sum(3 * (0.2e-3 + COST[c] / 4 ** EXPONENT[c]) * 8 for c in ("embed", "head"))
    assert plan.outside_time_s == pytest.approx(by_hand, rel=1e-12)
    assert plan.manual_stage_option is None
    with pytest.raises(ExportUnavailable, match="--no-outside-layers"):
        export_plan(plan, "alpa")
    with pytest.raises(ExportUnavailable, match="--for jaxpp"):
        export_plan(plan, "jaxpp")


def test_off_jaxpp_and_memory_keep_every_layer_in_the_pipeline() -> None:
    spec = _spec(GPT)
    inside, _ = _reference(GPT)
    for options in (_options(outside_layers=False), _options(target="jaxpp")):
        space, results = _table(spec, options)
        assert not options.allows_outside
        plan = build_plan(spec, cluster(1, 4), options, space, results)
        assert plan.outside == [] and plan.manual_stage_option is not None
        assert plan.predicted_iteration_time_s == pytest.approx(inside, rel=1e-9)
    # outside the pipeline every micro-batch's stash is kept: a layer that cannot hold B
    # of them stays inside
    stash = MEMORY // 5
    options = _options()
    space, results = _table(spec, options, stash)
    plan = build_plan(spec, cluster(1, 4), options, space, results)
    inside, outside = _reference(GPT, stash)
    assert math.isinf(outside) and plan.outside == []


def test_cheap_layers_around_the_blocks_stay_in_the_pipeline() -> None:
    classes = ["embed"] + ["block"] * 6 + ["embed"]  # cheap at both ends
    spec, options = _spec(classes), _options()
    space, results = _table(spec, options)
    plan = build_plan(spec, cluster(1, 4), options, space, results)
    inside, outside = _reference(classes)
    assert inside < outside
    assert plan.outside == [] and plan.predicted_iteration_time_s == pytest.approx(inside)


def test_layers_outside_are_added_on_the_whole_cluster_only() -> None:
    spec, options = _spec(GPT), _options()
    space = enumerate_candidates(spec, cluster(1, 4), options)
    more = with_layers_outside(space, spec, 4)
    added = {k.as_tuple() for k in more.keys} - {k.as_tuple() for k in space.keys}
    whole = [m for m, s in enumerate(space.submeshes) if s.num_devices == 4]
    assert added == {(i, i, m, 0) for i in (0, 7) for m in whole}
    blocks_only = _spec(["block"] * 4)
    assert with_layers_outside(space, blocks_only, 4) is space
