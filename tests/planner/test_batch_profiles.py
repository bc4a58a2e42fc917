"""Layer profiles interpolated between micro-batch sizes (planner.batch_profiles): exact on
affine data, never an extrapolation, and an estimate to the search (never a measurement):
the estimate search over counts whose middle counts start from interpolated profiles still
answers the optimum of the full tables, with measured stages only, and measures fewer
stages than when every count measures its own layer profiles."""

import math

import pytest

from planner import EstimateSearch, build_plan, enumerate_candidates
from planner.batch_profiles import (
    bracket,
    ident_index,
    inside,
    interpolate,
    interpolated_profile,
    stage_ident,
)
from planner.layer_profiles import is_profiled, with_layer_profiles
from planner.microbatches import MicrobatchSearch
from schemas import ModuleKind, ProfileStatus, StageProfileResult
from tests.planner import test_microbatches
from tests.planner.test_microbatches import (
    CLASSES,
    GLOBAL,
    WEIGHTS,
    chain,
    device_cluster,
    options,
    truth,
)
from tests.support.profiles import fake_profile


def affine(size: int) -> StageProfileResult:
    """A stage whose every number is affine in the micro-batch size (parameters constant)."""
    return fake_profile(
        "s",
        forward=1e-3 + 2e-4 * size,
        backward=3e-3 + 5e-4 * size,
        peak=5000 + 700 * size,
        initial_var_size=4096,
        intermediate_size=320 * size,
        flops=1.5e6 * size,
        available_memory=1 << 30,
    )


@pytest.mark.parametrize(("lo", "size", "hi"), [(1, 2, 4), (1, 3, 16), (2, 8, 32)])
def test_interpolation_is_exact_on_affine_stages(lo: int, size: int, hi: int) -> None:
    got = interpolate(affine(lo), lo, affine(hi), hi, size, fingerprint="fp")
    want = affine(size)
    for kind in (ModuleKind.forward, ModuleKind.backward):
        a, b = got.module(kind), want.module(kind)
        assert a is not None and b is not None
        assert a.compute_cost == pytest.approx(b.compute_cost, rel=1e-12)
    assert got.peak_memory == want.peak_memory
    assert got.initial_var_size == want.initial_var_size == 4096
    assert got.intermediate_size == want.intermediate_size
    assert got.flops == pytest.approx(want.flops, rel=1e-12)
    assert got.fingerprint == "fp" and got.ok and got.num_layers == 1


def test_never_extrapolates_nor_mixes_stages() -> None:
    with pytest.raises(ValueError, match="not between"):
        interpolate(affine(1), 1, affine(4), 4, 8)
    with pytest.raises(ValueError, match="failed"):
        interpolate(fake_profile("x", ProfileStatus.oom), 1, affine(4), 4, 2)
    two = fake_profile("y", num_layers=2)
    with pytest.raises(ValueError, match="different stages"):
        interpolate(affine(1), 1, two, 4, 2)
    assert bracket(4, [1, 2, 8, 16]) == (2, 8)
    assert bracket(1, [1, 2, 8]) is None and bracket(8, [1, 2, 8]) is None
    assert inside(2, [1, 2, 4]) and not inside(1, [1, 2, 4]) and not inside(4, [1, 2, 4])
    ident = (0, 0, 0, "c")
    measured = {1: {ident: affine(1)}, 4: {ident: fake_profile("z", ProfileStatus.oom)}}
    assert interpolated_profile(ident, 2, measured) is None  # the end above failed
    measured[8] = {ident: affine(8)}
    made = interpolated_profile(ident, 2, measured)
    assert made is not None and made.intermediate_size == 640  # from 1 and 8


def _count_space(count: int):
    size = GLOBAL // count
    spec = chain(len(CLASSES), size, CLASSES)
    fixed = options([2, 4, 8, 16], config_space="data_parallel_only").at_count(count, size)
    base = enumerate_candidates(spec, device_cluster(), fixed)
    space, scaled, _ = with_layer_profiles(base, CLASSES)
    return spec, fixed, space, scaled


@pytest.mark.parametrize(("overhead", "fastest"), [(0.3e-3, 2), (0.15e-3, 8)])
def test_counts_between_start_from_interpolated_profiles_and_still_find_the_optimum(
    overhead: float, fastest: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counts 2, 4, 8, 16 (micro-batches of 8, 4, 2, 1) on a synthetic chain whose costs are
    affine in the size: the layer profiles are measured at the extreme sizes holding each
    config only; the answer is the optimum of the full tables, made of measured stages (a
    count at an extreme size, or one between whose search started from interpolations)."""
    monkeypatch.setattr(test_microbatches, "OVERHEAD", overhead)
    weights = [WEIGHTS[c] for c in CLASSES]
    counts = [2, 4, 8, 16]
    searches, full, spaces = {}, {}, {}
    for count in counts:
        spec, fixed, space, scaled = _count_space(count)
        results = truth(space, weights, GLOBAL // count)
        searches[count] = EstimateSearch(spec, device_cluster(), fixed, space, frozenset(scaled))
        full[count] = (results, build_plan(spec, device_cluster(), fixed, space, results))
        spaces[count] = space
    holders: dict = {}
    for count, space in spaces.items():
        for ident in ident_index(space):
            holders.setdefault(ident, set()).add(GLOBAL // count)
    interpolated = {}
    for count in counts:  # the extreme sizes of each stage: measured
        size, space = GLOBAL // count, spaces[count]
        profiles = [k for k in full[count][0] if is_profiled(k, CLASSES)]
        between = [k for k in profiles if inside(size, holders[stage_ident(space, k)])]
        interpolated[count] = between
        for key in profiles:
            if key not in between:
                searches[count].add([key], full[count][0][key])
    assert not interpolated[2] and not interpolated[16] and interpolated[4] and interpolated[8]
    measured_at = {
        GLOBAL // c: {stage_ident(spaces[c], k): r for k, r in searches[c].measured.items()}
        for c in counts
    }
    for count in (4, 8):  # the sizes between: interpolated, exact here (affine costs)
        size, space = GLOBAL // count, spaces[count]
        for key in interpolated[count]:
            made = interpolated_profile(stage_ident(space, key), size, measured_at)
            assert made is not None
            want = full[count][0][key]
            assert made.compute_cost == pytest.approx(want.compute_cost, rel=1e-9)
            assert made.intermediate_size == want.intermediate_size
            searches[count].add_prior([key], made)
        assert not set(interpolated[count]) & set(searches[count].measured)  # estimates only
    multi = MicrobatchSearch(searches, GLOBAL)
    while wanted := multi.next_round():
        for count, keys in wanted.items():
            for key in keys:
                multi.add(count, [key], full[count][0][key])
    plan = multi.plan()
    best = min(p.predicted_iteration_time_s for _, p in full.values())
    assert math.isclose(plan.predicted_iteration_time_s, best, rel_tol=1e-9)
    assert plan.num_microbatches == fastest
    assert all(s.measured for s in [*plan.stages, *plan.outside])
    # fewer stages measured than every count's own layer profiles and then its rounds
    profiles_everywhere = sum(
        len([k for k in full[c][0] if is_profiled(k, CLASSES)]) for c in counts
    )
    profiles_measured = sum(
        len([k for k in searches[c].measured if is_profiled(k, CLASSES)]) for c in counts
    )
    assert profiles_measured < profiles_everywhere


def test_a_measured_prior_widens_the_band_by_its_error() -> None:
    spec, fixed, space, scaled = _count_space(4)
    search = EstimateSearch(spec, device_cluster(), fixed, space, frozenset(scaled))
    singles = [k.as_tuple() for k in space.keys if k.start == k.end][:4]
    for key in singles:
        search.add_prior([key], fake_profile("p", forward=1e-3, backward=1e-3))
    assert not search.measured and search.band() == pytest.approx(0.15)
    for key in singles:  # measured 40% slower than the interpolated prior
        search.add([key], fake_profile("m", forward=1.4e-3, backward=1.4e-3))
    assert set(search.measured) == set(singles) and not search.estimator.profiles().keys() - set(
        singles
    )
    assert search.prior_errors and all(
        e == pytest.approx(0.4 / 1.4) for e in search.prior_errors.values()
    )
    assert search.band() == pytest.approx(0.4 / 1.4)
