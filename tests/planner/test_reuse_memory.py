"""A store outlives its jobs: measurements saved by jobs on big devices, planned for a job on
small ones. Every stage of every plan shown (the plan, its runner-up, the baselines) must fit
the asking job's device under its schedule's memory rule, recomputed here from each stage's
peak, parameters + optimizer state and stash (not from the planner's arrays or rows)."""

import math
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session

import store
from planner import EstimateSearch, NoFeasiblePlan, build_plan, enumerate_candidates
from planner.schedule import simulate
from planner.table import build_cost_table
from schemas import (
    ClusterSpec,
    Plan,
    PlannedStage,
    PlanOptions,
    ProfileStatus,
    StageProfileResult,
)
from tests.planner.helpers import programless_chain_spec
from tests.support.profiles import fake_profile

MIB = 2**20
BIG = 64 * 2**30  # the devices of the jobs that measured


def alpa_rule(available: int, peak: int, initial: int, stash: int) -> int:
    """Alpa's max_n_succ_stages, written out: floor(free / stash) - 1 in [-1, 2**20]."""
    free = available - peak - initial
    if free < 0:
        return -1
    if stash == 0:
        return 2**20
    return max(-1, min(2**20, free // stash - 1))


def in_flight(name: str, stages: list[PlannedStage], micro: int, v: int) -> list[int]:
    """The most micro-batches each stage (chunk) keeps at once: 1F1B's min(p - s, B), GPipe's
    B, interleaved counted from its simulated ops (forward started, backward not ended)."""
    n = len(stages)
    if name == "1f1b":
        return [min(n - s, micro) for s in range(n)]
    if name == "gpipe":
        return [micro] * n
    assert name == "interleaved", name
    forward = [stage.forward_cost for stage in stages]
    backward = [stage.backward_cost for stage in stages]
    sched = simulate(name, forward, backward, micro, None, n // v)
    kept = [0] * n
    for k in range(n):
        spans = [
            (op.start_s, op.end_s, op.kind, op.microbatch) for op in sched.ops if op.stage == k
        ]
        starts = {mb: s for s, _, kind, mb in spans if kind == "forward"}
        ends = {mb: e for _, e, kind, mb in spans if kind == "backward"}
        for t in starts.values():
            kept[k] = max(kept[k], sum(1 for mb in starts if starts[mb] <= t < ends[mb]))
    return kept


def check_fits(name: str, stages: list[PlannedStage], micro: int, v: int, device: int) -> None:
    """Every stage's device group holds its stages' peak, parameters and optimizer state
    and kept stashes within `device` bytes; each stage's max_n_succ_stages is this job's."""
    kept = in_flight(name, stages, micro, v)
    groups = len(stages) // v
    load = [0] * groups
    for s, stage in enumerate(stages):
        assert stage.max_n_succ_stages == alpa_rule(
            device, stage.peak_memory, stage.initial_var_size, stage.intermediate_size
        ), (name, s, stage)
        fixed = stage.peak_memory + stage.initial_var_size
        load[s % groups] += fixed + kept[s] * stage.intermediate_size
    for g, need in enumerate(load):
        assert need <= device, f"{name}: device group {g} needs {need / MIB:.2f} MiB"


def check_plan(plan: Plan, device: int) -> None:
    micro = plan.num_microbatches
    check_fits(plan.schedule_name, plan.stages, micro, plan.virtual_stages, device)
    if plan.runner_up is not None:
        ru = plan.runner_up
        check_fits(ru.schedule_name or "1f1b", ru.stages, micro, ru.virtual_stages, device)
    for base in plan.baselines:
        if base.iteration_time_s is not None:
            check_fits("1f1b", base.stages, micro, 1, device)
    for option in plan.schedules:
        assert option.peak_memory is None or option.peak_memory <= device
    if plan.stability == "unique":
        assert not [o for o in plan.schedules if o.feasible and not o.chosen]


@st.composite
def stores(draw: st.DrawFn) -> tuple[int, int, int, dict[tuple[int, int, int, int], dict]]:
    """(layers, devices, micro-batches, each candidate's measured figures)."""
    layers = draw(st.integers(2, 4))
    devices = draw(st.sampled_from([1, 2, 4]))
    micro = draw(st.sampled_from([1, 2, 4]))
    spec = programless_chain_spec(layers)
    cluster = ClusterSpec(num_hosts=1, devices_per_host=devices)
    space = enumerate_candidates(spec, cluster, options(micro))
    figures = {}
    for key in space.keys:
        n = key.end - key.start + 1
        figures[key.as_tuple()] = {
            "seconds": draw(st.floats(0.2, 2.0)) * n,
            "peak": draw(st.integers(MIB // 10, 3 * MIB)) * n,
            "initial": draw(st.integers(0, 2 * MIB)) * n,
            "stash": draw(st.integers(MIB // 100, 2 * MIB)) * n,
        }
    return layers, devices, micro, figures


def options(micro: int) -> PlanOptions:
    return PlanOptions(num_microbatches=micro, strategies=["data"], schedule="auto")


def stored(session: Session, figures: dict, space) -> dict:
    """Each candidate measured on BIG devices, saved, and read back as a job reuses it."""
    out = {}
    for key, f in figures.items():
        submesh, config = space.resolve(key)
        measured = fake_profile(
            uuid.uuid4().hex,
            forward=f["seconds"] / 3,
            backward=2 * f["seconds"] / 3,
            submesh=submesh,
            config=config,
            num_layers=key[1] - key[0] + 1,
            peak=f["peak"],
            available_memory=BIG,
            initial_var_size=f["initial"],
            intermediate_size=f["stash"],
            max_n_succ_stages=alpa_rule(BIG, f["peak"], f["initial"], f["stash"]),
        )
        row = store.save_profile(session, result=measured)
        (found,) = store.reusable_profiles(session, fingerprints=[row.fingerprint]).values()
        out[key] = store.profile_result(found)
    return out


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(stores(), st.integers(MIB, 12 * MIB))
def test_plans_from_a_store_of_bigger_devices_fit_the_asking_job(
    session: Session, drawn: tuple, device: int
) -> None:
    layers, devices, micro, figures = drawn
    spec = programless_chain_spec(layers)
    cluster = ClusterSpec(num_hosts=1, devices_per_host=devices, device_memory_bytes=device)
    opts = options(micro)
    space = enumerate_candidates(spec, cluster, opts)
    results: dict[tuple[int, int, int, int], StageProfileResult] = stored(session, figures, space)
    table = build_cost_table(spec, cluster, space, results)
    assert all(table.available[k] == device for k in table.results)
    try:
        plan = build_plan(spec, cluster, opts, space, results)
    except NoFeasiblePlan:
        plan = None
    if plan is not None:
        check_plan(plan, device)
    # the estimate search, with the longer stages left to estimates from the layer profiles
    search = EstimateSearch(spec, cluster, opts, space)
    for key, result in results.items():
        if key[1] - key[0] <= 1 or (key[0], key[1]) == (0, layers - 1):
            search.add([key], result)
    try:
        estimated = search.plan()
    except NoFeasiblePlan:
        return
    check_plan(estimated, device)
    assert math.isfinite(estimated.predicted_iteration_time_s)


def test_a_stored_result_seen_on_another_device_keeps_what_was_measured() -> None:
    measured = fake_profile(
        "fp",
        peak=3 * MIB,
        available_memory=BIG,
        initial_var_size=MIB,
        intermediate_size=MIB // 2,
        max_n_succ_stages=alpa_rule(BIG, 3 * MIB, MIB, MIB // 2),
    )
    assert measured.max_n_succ_stages > 100_000
    seen = measured.for_device_memory(8 * MIB)
    assert (seen.available_memory, seen.max_n_succ_stages) == (8 * MIB, 7)  # 4 MiB / 0.5 - 1
    assert seen.for_device_memory(BIG) == measured
    kept = ("module_profile_results", "initial_var_size", "intermediate_size", "fingerprint")
    assert all(getattr(seen, name) == getattr(measured, name) for name in kept)
    assert measured.for_device_memory(4 * MIB - 1).max_n_succ_stages == -1
    failed = fake_profile("oom", ProfileStatus.oom, available_memory=BIG)
    assert failed.for_device_memory(8 * MIB).max_n_succ_stages == -1
