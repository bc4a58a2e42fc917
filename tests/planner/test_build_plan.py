"""build_plan: from measured results to a Plan with schedule, baselines and export."""

import math

import pytest

from planner import (
    NoFeasiblePlan,
    boundary_bytes,
    build_plan,
    enumerate_candidates,
    simulate_1f1b,
    training_dp,
)
from planner.table import build_cost_table
from schemas import PlanOptions, ProfileStatus, StageProfileResult
from tests.planner.brute_force import brute_training
from tests.planner.helpers import cluster, programless_chain_spec, result

OPTIONS = PlanOptions(num_microbatches=4, strategies=["data"], schedule="1f1b")


def measure_all(space, seconds, **kwargs) -> dict[tuple[int, int, int, int], StageProfileResult]:
    """A result for every key; `seconds(start, end, devices, config_id)` is its forward
    (inf: the key is left unmeasured)."""
    out = {}
    for key in space.keys:
        submesh, config = space.resolve(key)
        fwd = seconds(key.start, key.end, submesh.num_devices, key.config_id)
        if not math.isfinite(fwd):
            continue  # not measured
        out[key.as_tuple()] = result(
            submesh, config, fwd, 2 * fwd, num_layers=key.end - key.start + 1, **kwargs
        )
    return out


def scaling(start: int, end: int, devices: int, config_id: int) -> float:
    """Layers cost 1 s each on one device, split perfectly, +10% per config index."""
    return (end - start + 1) / devices * (1 + 0.1 * config_id) + 0.05


def test_plan_is_the_dp_optimum_with_schedule_baselines_and_export() -> None:
    spec, clu = programless_chain_spec(4), cluster(1, 4)
    space = enumerate_candidates(spec, clu, OPTIONS)
    results = measure_all(space, scaling)
    plan = build_plan(spec, clu, OPTIONS, space, results)

    table = build_cost_table(spec, clu, space, results)
    sizes = [s.num_devices for s in space.submeshes]
    expected = brute_training(table.compute_cost, table.max_n_succ_stages, sizes, 4, 4)
    assert math.isclose(plan.dp_cost_s, expected)
    assert plan.stages[0].start == 0 and plan.stages[-1].end == 3
    assert sum(s.submesh.num_devices for s in plan.stages) == 4
    for s in plan.stages:
        assert s.layer_names == [f"layer{i}" for i in range(s.start, s.end + 1)]
        assert math.isclose(s.compute_cost, s.forward_cost + s.backward_cost)
        assert s.config == space.configs[s.submesh_id][s.config_id]
        assert s.max_n_succ_stages == 100 and s.comm_cost_s == 0.0
    schedule = simulate_1f1b(
        [s.forward_cost for s in plan.stages], [s.backward_cost for s in plan.stages], 4
    )
    assert plan.predicted_iteration_time_s == schedule.iteration_time_s
    assert plan.bubble_fraction == schedule.bubble_fraction
    assert len(plan.schedule) == 2 * 4 * len(plan.stages)
    assert plan.dp_wall_seconds > 0

    export = plan.manual_stage_option
    assert export is not None
    assert export.forward_stage_layer_ids == [list(range(s.start, s.end + 1)) for s in plan.stages]
    assert export.submesh_physical_shapes == [s.submesh.as_tuple() for s in plan.stages]
    assert export.submesh_logical_shapes == [s.config.logical_mesh for s in plan.stages]
    assert export.submesh_autosharding_option_dicts == [
        {"force_batch_dim_to_mesh_dim": 0} for _ in plan.stages
    ]

    baselines = {b.name: b for b in plan.baselines}
    assert set(baselines) == {"data_parallel", "uniform_2", "uniform_4"}
    dp = baselines["data_parallel"]
    assert [(s.start, s.end, s.submesh.as_tuple(), s.config_id) for s in dp.stages] == [
        (0, 3, (1, 4), 0)
    ]
    assert math.isclose(dp.iteration_time_s, 4 * 3 * scaling(0, 3, 4, 0))
    uniform = baselines["uniform_2"]
    assert [(s.start, s.end, s.submesh.as_tuple()) for s in uniform.stages] == [
        (0, 1, (1, 2)),
        (2, 3, (1, 2)),
    ]
    # the DP's plan is at least as good as any baseline under its own objective
    for b in plan.baselines:
        costs = [s.compute_cost for s in b.stages]
        assert plan.dp_cost_s <= sum(costs) + 3 * max(costs) + 1e-12


def test_results_keyed_by_stage_key_are_accepted() -> None:
    spec, clu = programless_chain_spec(2), cluster(1, 2)
    space = enumerate_candidates(spec, clu, OPTIONS)
    by_tuple = measure_all(space, scaling)
    by_key = {k: by_tuple[k.as_tuple()] for k in space.keys}
    assert build_plan(spec, clu, OPTIONS, space, by_key).dp_cost_s == pytest.approx(
        build_plan(spec, clu, OPTIONS, space, by_tuple).dp_cost_s
    )
    with pytest.raises(ValueError, match="outside the candidate space"):
        build_plan(spec, clu, OPTIONS, space, {(0, 5, 0, 0): next(iter(by_tuple.values()))})


def test_every_candidate_failed() -> None:
    spec, clu = programless_chain_spec(3), cluster(1, 2)
    space = enumerate_candidates(spec, clu, OPTIONS)
    results = measure_all(space, scaling, status=ProfileStatus.oom)
    first = space.keys[0].as_tuple()
    results[first] = results[first].model_copy(update={"status": ProfileStatus.compile_error})
    del results[space.keys[1].as_tuple()]
    with pytest.raises(NoFeasiblePlan) as err:
        build_plan(spec, clu, OPTIONS, space, results)
    n = len(space.keys)
    assert err.value.reason == (
        f"every candidate failed: 1 compile_error, {n - 2} oom, 1 not measured"
    )


def test_memory_limits_explain_infeasibility() -> None:
    spec, clu = programless_chain_spec(2), cluster(1, 2)
    space = enumerate_candidates(spec, clu, OPTIONS)
    results = measure_all(space, scaling, max_n_succ_stages=0)  # no stage may follow any
    for key in [k.as_tuple() for k in space.keys if k.submesh_id == 1]:
        del results[key]  # and the one-stage plan on both devices was never measured
    with pytest.raises(NoFeasiblePlan, match="uses all 2 devices within memory limits"):
        build_plan(spec, clu, OPTIONS, space, results)


def test_uncovered_layers_explain_infeasibility() -> None:
    spec, clu = programless_chain_spec(3), cluster(1, 2)
    space = enumerate_candidates(spec, clu, OPTIONS)
    results = {k: r for k, r in measure_all(space, scaling).items() if k[0] == 0 and k[1] < 2}
    with pytest.raises(NoFeasiblePlan, match="covers all 3 layers on exactly 2 devices"):
        build_plan(spec, clu, OPTIONS, space, results)


def test_boundary_bytes_count_each_crossing_var_once() -> None:
    # h_i is f32[8, 16] = 512 bytes; with the skip, h0 also crosses boundaries 1 and 2
    assert boundary_bytes(programless_chain_spec(4)).tolist() == [512, 512, 512, 0]
    assert boundary_bytes(programless_chain_spec(4, skip=True)).tolist() == [512, 1024, 1024, 0]


def test_communication_term_adds_transfer_time() -> None:
    spec, clu = programless_chain_spec(4, skip=True), cluster(2, 2)
    options = OPTIONS.model_copy(update={"include_communication": True})
    space = enumerate_candidates(spec, clu, options)
    # two stages on (1, 2) beat one stage on all 4 devices (50% scaling loss) until the
    # transfers between them (5e-9 s per 512 B at 100 GB/s) count
    results = measure_all(space, lambda a, b, d, c: 2e-9 * (b - a + 1) / d * (1.5 if d == 4 else 1))
    table = build_cost_table(spec, clu, space, results, include_communication=True)
    intra, inter = clu.intra_host_bandwidth_bytes_per_s, clu.inter_host_bandwidth_bytes_per_s
    # stage (1, 2) on (1, 2) sends 1024 B forward (after layer 2) and 512 B backward
    assert table.comm_forward[1, 2, 1] == pytest.approx(1024 / intra)
    assert table.comm_backward[1, 2, 1] == pytest.approx(512 / intra)
    assert table.comm_forward[0, 0, 2] == pytest.approx(512 / inter)  # (2, 2): two hosts
    assert table.comm_backward[0, 3, 2] == 0 and table.comm_forward[0, 3, 2] == 0
    plan = build_plan(spec, clu, options, space, results)
    without = build_plan(spec, clu, OPTIONS, space, results)
    assert plan.include_communication and not without.include_communication
    shapes = [s.as_tuple() for s in space.submeshes]
    expected = training_dp(table.dp_cost, table.max_n_succ_stages, shapes, 4, 4)
    assert plan.dp_cost_s == pytest.approx(expected.cost)
    assert [(s.start, s.end, s.submesh.as_tuple()) for s in without.stages] == [
        (0, 1, (1, 2)),
        (2, 3, (1, 2)),
    ]
    assert [(s.start, s.end, s.submesh.as_tuple()) for s in plan.stages] == [(0, 3, (2, 2))]
    uniform = next(b for b in plan.baselines if b.name == "uniform_2")
    assert [s.comm_cost_s for s in uniform.stages] == pytest.approx([1024 / intra] * 2)
    # the schedule of the 2-stage baseline includes the transfers
    assert (
        uniform.iteration_time_s
        > next(b for b in without.baselines if b.name == "uniform_2").iteration_time_s
    )


def test_baseline_reports_why_it_is_infeasible() -> None:
    spec, clu = programless_chain_spec(2), cluster(1, 2)
    space = enumerate_candidates(spec, clu, OPTIONS)
    results = measure_all(space, scaling)
    whole = [k.as_tuple() for k in space.keys if k.submesh_id == 1]
    for key in whole:
        results[key] = results[key].model_copy(update={"status": ProfileStatus.oom})
    plan = build_plan(spec, clu, OPTIONS, space, results)
    dp = next(b for b in plan.baselines if b.name == "data_parallel")
    assert dp.iteration_time_s is None and dp.stages == []
    assert dp.reason == f"layers 0-1 on 1x2: no usable config ({len(whole)} oom)"
