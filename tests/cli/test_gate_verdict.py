"""The gate's rules on hand-made plan pairs: memory fit (today's plan and the baseline's
layout re-measured), slowdown against tolerance and measured spread, FLOPs and peak memory
growth, layout changes, a job without a plan."""

import pytest

from cli.gate.verdict import (
    Check,
    Figure,
    Outcome,
    Remeasured,
    Tolerances,
    Verdict,
    decide,
    undecided,
)
from schemas import (
    Plan,
    PlannedStage,
    ProfileStatus,
    ShardingConfig,
    SubmeshShape,
)
from tests.support.profiles import fake_profile

MIB = 2**20
DEVICE = 64 * MIB
TOL = Tolerances(max_slowdown=0.05, max_growth=0.02)


def stage(
    start: int,
    end: int,
    *,
    cost: float = 0.010,
    peak: int = 8 * MIB,
    params: int = 4 * MIB,
    stash: int = 1 * MIB,
    flops: float = 1e9,
    max_succ: int = 10,
    devices: int = 1,
) -> PlannedStage:
    return PlannedStage(
        start=start,
        end=end,
        layer_names=[f"layer{i}" for i in range(start, end + 1)],
        submesh_id=devices.bit_length() - 1,
        config_id=0,
        submesh=SubmeshShape(hosts=1, devices_per_host=devices),
        config=ShardingConfig(logical_mesh=(devices, 1), strategy="data"),
        forward_cost=cost / 3,
        backward_cost=2 * cost / 3,
        compute_cost=cost,
        peak_memory=peak,
        initial_var_size=params,
        intermediate_size=stash,
        max_n_succ_stages=max_succ,
        fingerprint=f"fp-{start}-{end}-{devices}",
        flops=flops,
    )


def plan_of(stages: list[PlannedStage], *, time_s: float = 0.050, spread: float = 0.0) -> Plan:
    return Plan(
        stages=stages,
        num_microbatches=4,
        num_layers=stages[-1].end + 1,
        num_devices=sum(s.submesh.num_devices for s in stages),
        dp_cost_s=time_s,
        predicted_iteration_time_s=time_s,
        bubble_fraction=0.2,
        cost_spread=spread,
    )


def measured(
    st: PlannedStage, *, status: ProfileStatus = ProfileStatus.ok, **figures
) -> Remeasured:
    """Today's measurement of `st`: its own figures unless overridden (peak, params, stash,
    flops, max_succ), or a failure status."""
    return Remeasured(
        result=fake_profile(
            st.fingerprint,
            status,
            forward=st.forward_cost,
            backward=st.backward_cost,
            error="RESOURCE_EXHAUSTED: out of memory allocating 80 MiB",
            submesh=st.submesh,
            config=st.config,
            num_layers=st.end - st.start + 1,
            peak=figures.get("peak", st.peak_memory),
            available_memory=DEVICE,
            initial_var_size=figures.get("params", st.initial_var_size),
            intermediate_size=figures.get("stash", st.intermediate_size),
            max_n_succ_stages=figures.get("max_succ", st.max_n_succ_stages),
            flops=figures.get("flops", st.flops),
        )
    )


def same_as(plan: Plan) -> list[Remeasured]:
    return [measured(s) for s in plan.stages]


def by_name(verdict: Verdict) -> dict[str, Check]:
    return {c.name: c for c in verdict.checks}


BASE = plan_of([stage(0, 1), stage(2, 3)])


def test_the_same_plan_passes_every_check_and_names_each_stage() -> None:
    v = decide(BASE, BASE, same_as(BASE), TOL, device_memory_bytes=DEVICE)
    assert v.exit_code == 0 and v.label == "pass"
    assert {c.outcome for c in v.checks} == {Outcome.passed}
    assert set(by_name(v)) == {
        "layout",
        "iteration time",
        "stage 0 fits memory",
        "stage 1 fits memory",
        "stage 0 FLOPs",
        "stage 0 peak memory",
        "stage 1 FLOPs",
        "stage 1 peak memory",
    }
    fit = by_name(v)["stage 0 fits memory"].reason
    # stage 0 has one stage after it: two micro-batches' stash are kept
    assert "layers 0-1 on 1x1 as 1x1/data" in fit
    assert "peak 8 MiB + params 4 MiB + 2 × stash 1 MiB = 14 MiB of 64 MiB" in fit
    assert all("\n" not in c.reason for c in v.checks)


def test_a_stage_of_todays_plan_that_no_longer_fits_fails() -> None:
    today = plan_of([stage(0, 1, max_succ=0, peak=60 * MIB), stage(2, 3)])
    v = decide(BASE, today, same_as(today), TOL, device_memory_bytes=DEVICE)
    check = by_name(v)["stage 0 fits memory"]
    assert check.outcome == Outcome.failed and check.stage == 0
    assert check.reason.startswith("stage 0 (layers 0-1 on 1x1 as 1x1/data) no longer fits")
    assert "peak 60 MiB" in check.reason
    assert by_name(v)["stage 1 fits memory"].outcome == Outcome.passed
    assert v.exit_code == 1


def test_the_baseline_layout_is_re_costed_when_todays_plan_differs() -> None:
    today = plan_of([stage(0, 2), stage(3, 3)])
    # The baseline's stage 1 (layers 2-3) measured today: its stash no longer fits.
    remeasured = [measured(BASE.stages[0]), measured(BASE.stages[1], max_succ=-1)]
    v = decide(BASE, today, remeasured, TOL, device_memory_bytes=DEVICE)
    checks = by_name(v)
    assert checks["layout"].outcome == Outcome.note
    assert "0-1 on 1x1 as 1x1/data · 2-3 on 1x1 as 1x1/data →" in checks["layout"].reason
    assert checks["baseline stage 0 fits memory"].outcome == Outcome.passed
    failed = checks["baseline stage 1 fits memory"]
    assert failed.outcome == Outcome.failed and failed.stage == 1
    assert failed.reason.startswith("baseline stage 1 (layers 2-3 on 1x1 as 1x1/data) no longer")
    assert "baseline stage 1 FLOPs" in checks  # growth is checked on the baseline's stages
    assert v.exit_code == 1


def test_an_oom_of_a_baseline_stage_fails_and_a_pruned_one_is_a_note() -> None:
    today = plan_of([stage(0, 0), stage(1, 3)])
    remeasured = [
        measured(BASE.stages[0], status=ProfileStatus.oom),
        Remeasured(missing="pruned: today's job found it could not be in a better plan"),
    ]
    v = decide(BASE, today, remeasured, TOL, device_memory_bytes=DEVICE)
    checks = by_name(v)
    oom = checks["baseline stage 0 fits memory"]
    assert oom.outcome == Outcome.failed
    assert "out of memory when measured today (RESOURCE_EXHAUSTED" in oom.reason
    pruned = checks["baseline stage 1 fits memory"]
    assert pruned.outcome == Outcome.note and "pruned" in pruned.reason
    # Neither has figures to compare: no growth checks for them.
    assert not [c for c in v.checks if c.figure in (Figure.flops, Figure.peak)]


def test_a_layout_change_alone_passes_with_a_note() -> None:
    today = plan_of([stage(0, 0), stage(1, 3)])
    v = decide(BASE, today, same_as(BASE), TOL, device_memory_bytes=DEVICE)
    assert v.exit_code == 0
    assert [c.name for c in v.checks if c.outcome == Outcome.note] == ["layout"]


@pytest.mark.parametrize(
    ("after_s", "spreads", "expected"),
    [
        (0.0510, (0.0, 0.0), Outcome.note),  # +2%: within 5%, but a move beyond no spread
        (0.0540, (0.0, 0.0), Outcome.failed),  # +8% > 5%, no spread
        (0.0540, (0.05, 0.05), Outcome.note),  # +8% > 5% but within the 10% spread
        (0.0575, (0.05, 0.05), Outcome.failed),  # +15% beyond the 10% spread
        (0.0502, (0.01, 0.01), Outcome.passed),  # +0.4%: within the 2% spread
        (0.0400, (0.01, 0.01), Outcome.note),  # 20% faster: beyond the spread, a note
    ],
)
def test_slowdown_fails_only_beyond_the_tolerance_and_the_measured_spread(
    after_s: float, spreads: tuple[float, float], expected: Outcome
) -> None:
    base = plan_of(BASE.stages, time_s=0.050, spread=spreads[0])
    today = plan_of(BASE.stages, time_s=after_s, spread=spreads[1])
    check = by_name(decide(base, today, same_as(base), TOL))["iteration time"]
    assert check.outcome == expected, check.reason
    assert check.reason.startswith("predicted iteration time 50 ms → ")


def test_slowdown_reason_names_the_figures_and_the_tolerance() -> None:
    today = plan_of(BASE.stages, time_s=0.056, spread=0.01)
    check = by_name(decide(BASE, today, same_as(BASE), TOL))["iteration time"]
    assert check.reason == (
        "predicted iteration time 50 ms → 56 ms (+12.0%), beyond the 5.0% allowed and the "
        "measured spread 1.0%"
    )


def test_a_custom_max_slowdown_is_used() -> None:
    today = plan_of(BASE.stages, time_s=0.056)
    lenient = Tolerances(max_slowdown=0.15, max_growth=0.02)
    assert by_name(decide(BASE, today, same_as(BASE), lenient))["iteration time"].outcome == (
        Outcome.note
    )


def test_flops_growth_beyond_the_tolerance_fails_naming_the_stage() -> None:
    remeasured = [measured(BASE.stages[0]), measured(BASE.stages[1], flops=2.1e9)]
    v = decide(BASE, BASE, remeasured, TOL)
    check = by_name(v)["stage 1 FLOPs"]
    assert check.outcome == Outcome.failed and check.stage == 1
    assert check.reason == (
        "stage 1 (layers 2-3 on 1x1 as 1x1/data): FLOPs per device 1 GFLOP → 2.1 GFLOP "
        "(+110.0%), beyond the 2.0% allowed"
    )
    assert by_name(v)["stage 0 FLOPs"].outcome == Outcome.passed
    assert v.exit_code == 1


def test_peak_growth_within_tolerance_is_a_note_and_beyond_it_fails() -> None:
    small = [measured(BASE.stages[0], peak=int(8 * MIB * 1.01)), measured(BASE.stages[1])]
    note = by_name(decide(BASE, BASE, small, TOL))["stage 0 peak memory"]
    assert note.outcome == Outcome.note and "within tolerance" in note.reason
    large = [measured(BASE.stages[0], peak=int(8 * MIB * 1.03)), measured(BASE.stages[1])]
    v = decide(BASE, BASE, large, TOL)
    failed = by_name(v)["stage 0 peak memory"]
    assert failed.outcome == Outcome.failed
    assert "peak memory per device 8 MiB → 8.24 MiB (+3.0%)" in failed.reason
    assert v.exit_code == 1


def test_shrinking_figures_are_notes_not_failures() -> None:
    remeasured = [measured(BASE.stages[0], flops=0.5e9, peak=4 * MIB), measured(BASE.stages[1])]
    v = decide(BASE, BASE, remeasured, TOL)
    assert v.exit_code == 0
    assert by_name(v)["stage 0 FLOPs"].outcome == Outcome.note
    assert "(-50.0%)" in by_name(v)["stage 0 FLOPs"].reason


def test_a_baseline_without_flops_is_a_note_asking_for_a_refresh() -> None:
    old = plan_of([stage(0, 1, flops=0.0), stage(2, 3, flops=0.0)])
    v = decide(old, old, [measured(s, flops=1e9) for s in old.stages], TOL)
    check = by_name(v)["stage 0 FLOPs"]
    assert check.outcome == Outcome.note and "refresh the baseline" in check.reason
    assert v.exit_code == 0


def test_a_job_without_a_plan_is_undecided_unless_a_check_fails() -> None:
    v = decide(BASE, None, same_as(BASE), TOL, job_error="every candidate failed: timeout 20")
    assert v.exit_code == 2 and v.label == "undecided"
    assert by_name(v)["plan"].reason == (
        "today's job has no plan: every candidate failed: timeout 20"
    )
    oom = [measured(BASE.stages[0], status=ProfileStatus.oom), measured(BASE.stages[1])]
    v = decide(BASE, None, oom, TOL, job_error="no combination of stages ... within memory")
    assert v.exit_code == 1
    assert by_name(v)["baseline stage 0 fits memory"].outcome == Outcome.failed


def test_estimates_never_decide() -> None:
    """A baseline stage today's job only estimated has no figure compared; a stage
    of today's plan with estimated numbers (a plan is built from measured ones) leaves the
    gate undecided, even where its estimated memory or time would fail."""
    estimated = Remeasured(missing="estimated only: today's job did not measure it")
    v = decide(BASE, BASE, [measured(BASE.stages[0]), estimated], TOL, device_memory_bytes=DEVICE)
    assert v.exit_code == 0 and "stage 1 FLOPs" not in by_name(v)
    today = plan_of(
        [
            stage(0, 1),
            stage(2, 3, max_succ=-1, peak=60 * MIB).model_copy(update={"measured": False}),
        ],
        time_s=0.5,
    )
    v = decide(BASE, today, same_as(BASE), TOL, device_memory_bytes=DEVICE)
    assert v.exit_code == 2
    check = by_name(v)["stage 1 measured"]
    assert check.outcome == Outcome.undecided and check.stage == 1
    assert "stage 1 (layers 2-3 on 1x1 as 1x1/data) of today's plan was estimated" in check.reason
    assert not {"iteration time", "stage 1 fits memory"} & set(by_name(v))
    # the same plan measured: its time (10x the baseline's) fails
    measured_today = today.model_copy(update={"stages": BASE.stages})
    v = decide(BASE, measured_today, same_as(BASE), TOL, device_memory_bytes=DEVICE)
    assert v.exit_code == 1 and by_name(v)["iteration time"].outcome == Outcome.failed


def test_undecided_verdict_and_argument_checks() -> None:
    v = undecided("cannot reach the server at http://127.0.0.1:9: Connection refused")
    assert v.exit_code == 2 and v.checks[0].outcome == Outcome.undecided
    with pytest.raises(ValueError, match="one entry per baseline stage"):
        decide(BASE, BASE, [], TOL)


@pytest.mark.parametrize(("max_succ", "fits"), [(1, True), (0, False), (-1, False)])
def test_fit_is_alpas_rule_at_the_boundary(max_succ: int, fits: bool) -> None:
    """Stage 0 of two has one stage after it: it fits while max_n_succ_stages >= 1."""
    today = plan_of([stage(0, 1, max_succ=max_succ), stage(2, 3, max_succ=0)])
    v = decide(today, today, same_as(today), TOL, device_memory_bytes=DEVICE)
    assert by_name(v)["stage 0 fits memory"].outcome == (Outcome.passed if fits else Outcome.failed)
    assert by_name(v)["stage 1 fits memory"].outcome == Outcome.passed  # the last stage


def test_the_verdict_follows_the_plans_schedule() -> None:
    # today: interleaved, 2 groups x 2 chunks; group 1's predicted memory is over the device
    chunks = [
        stage(i, i).model_copy(update={"device_group": i % 2, "schedule_memory": mem})
        for i, mem in enumerate([30 * MIB, 70 * MIB, 30 * MIB, 70 * MIB])
    ]
    today = plan_of(chunks, time_s=0.040).model_copy(
        update={"schedule_name": "interleaved", "virtual_stages": 2}
    )
    v = decide(BASE, today, same_as(BASE), TOL, device_memory_bytes=DEVICE)
    checks = by_name(v)
    assert "schedule 1f1b → interleaved (v=2)" in checks["layout"].reason
    assert "[1f1b → interleaved (v=2)]" in checks["iteration time"].reason
    assert checks["stage 0 fits memory"].outcome == Outcome.passed
    assert "30 MiB of 64 MiB per device of its device group" in checks["stage 0 fits memory"].reason
    assert checks["stage 1 fits memory"].outcome == Outcome.failed
    # GPipe keeps every micro-batch: 4 stashes, so a stage allowing 2 more does not fit
    gpipe = plan_of([stage(0, 1, max_succ=2), stage(2, 3)]).model_copy(
        update={"schedule_name": "gpipe"}
    )
    v = decide(BASE, gpipe, same_as(BASE), TOL, device_memory_bytes=DEVICE)
    fit = by_name(v)["stage 0 fits memory"]
    assert fit.outcome == Outcome.failed and "4 × stash 1 MiB" in fit.reason
