"""Counts of micro-batches calibrate one another (planner.microbatches): a count with no
longer stage measured takes its length law and band from the counts that have one; each
count asks for one longer stage first, the lead is verified whole and the challengers a
few stages a round, and a count whose calibrated best is slower than a measured plan stops;
the answer stays the optimum of the full tables where longer stages cost more than their
layers."""

import math

import numpy as np
import pytest

from planner import EstimateSearch, build_plan, enumerate_candidates
from planner.layer_profiles import layer_profile_keys, with_layer_profiles
from planner.microbatches import MicrobatchSearch
from planner.verify_report import stage_key
from tests.planner.test_microbatches import (
    CLASSES,
    GLOBAL,
    WEIGHTS,
    chain,
    device_cluster,
    options,
    truth,
)

GAMMA = 0.4  # longer stages cost (n / 2)^GAMMA times what their layers do


def problems(counts: list[int]):
    """Each count's search (its layer profiles measured) and full table's plan."""
    opts = options(counts, config_space="data_parallel_only")
    searches, full = {}, {}
    for count in counts:
        size = GLOBAL // count
        spec = chain(len(CLASSES), size, CLASSES)
        fixed = opts.at_count(count, size)
        space, scaled, _ = with_layer_profiles(
            enumerate_candidates(spec, device_cluster(), fixed), CLASSES
        )
        results = truth(space, [WEIGHTS[c] for c in CLASSES], size, GAMMA)
        search = EstimateSearch(spec, device_cluster(), fixed, space, frozenset(scaled))
        for key in layer_profile_keys(space, CLASSES, scaled):
            search.add([key], results[key])
        searches[count] = search
        full[count] = (results, build_plan(spec, device_cluster(), fixed, space, results))
    return searches, full


def test_a_count_without_longer_stages_takes_the_others_length_law_and_band() -> None:
    searches, full = problems([2, 8])
    own, other = searches[2], searches[8]
    longer = [k for k in full[2][0] if k[1] - k[0] >= 3 and k[2:] == (0, 0)][:3]
    for key in longer:
        own.add([key], full[2][0][key])
    gamma = own.estimator.length_exponent()
    assert gamma == pytest.approx(GAMMA, abs=0.1)  # learned from its longer stages
    assert other.estimator.length_exponent() == 0.0  # alone: nothing to learn from
    assert other.band() == pytest.approx(0.15)  # the prior
    MicrobatchSearch(searches, GLOBAL)
    assert other.estimator.length_exponent() == pytest.approx(gamma)
    pooled = own.estimator.held_out_errors()
    assert len(pooled) == 3
    assert other.band() == pytest.approx(max(0.03, float(np.quantile(pooled, 0.75))))
    assert own.estimator.length_exponent() == pytest.approx(gamma)  # its own stays its own


def search_all(
    counts: list[int], calibrate: bool, narrow: bool = True, judge: bool = False
) -> tuple[MicrobatchSearch, dict, int]:
    """The search over `counts` run to its end on the lengthened tables (`calibrate` False:
    each count learns only from its own stages; `narrow` False: every count asks for all
    its stages at once; `judge`: as a job measures a round, one stage at a time, the counts
    in `measure_order`, each judged before its next stage and not measured further in the
    round once it is `beaten` or `held_back`); the stages it measured in its rounds."""
    searches, full = problems(counts)
    multi = MicrobatchSearch(searches, GLOBAL)
    if not narrow:
        multi._narrow = lambda wanted: None  # type: ignore[method-assign]
    if not calibrate:
        for search in searches.values():
            search.estimator.peers = []
    measured = 0
    wanted = multi.next_round()
    while wanted:
        for count in multi.measure_order(wanted) if judge else wanted:
            for key in wanted[count]:
                if judge and multi.not_now(count):
                    break
                multi.add(count, [key], full[count][0][key])
                measured += 1
        wanted = multi.next_round()
    return multi, full, measured


@pytest.mark.parametrize("counts", [[2, 4, 8, 16], [1, 2, 4, 8, 16], [4, 8, 16]])
def test_the_search_over_counts_calibrated_gives_the_optimum_measuring_fewer(
    counts: list[int],
) -> None:
    multi, full, measured = search_all(counts, calibrate=True)
    plan = multi.plan()
    best = min(p.predicted_iteration_time_s for _, p in full.values())
    assert math.isclose(plan.predicted_iteration_time_s, best, rel_tol=1e-9)
    assert all(s.measured for s in plan.stages)
    _, _, alone = search_all(counts, calibrate=False)
    assert measured < alone


@pytest.mark.parametrize("counts", [[2, 4, 8, 16], [1, 2, 4, 8, 16]])
def test_counts_asking_for_their_costliest_stages_first_measure_fewer(
    counts: list[int],
) -> None:
    narrow, full, measured = search_all(counts, calibrate=True)
    wide, _, all_at_once = search_all(counts, calibrate=True, narrow=False)
    assert narrow.plan().predicted_iteration_time_s == wide.plan().predicted_iteration_time_s
    best = min(p.predicted_iteration_time_s for _, p in full.values())
    assert math.isclose(narrow.plan().predicted_iteration_time_s, best, rel_tol=1e-9)
    assert measured < all_at_once


@pytest.mark.parametrize("counts", [[2, 4, 8, 16], [1, 2, 4, 8, 16], [4, 8, 16]])
def test_counts_judged_as_a_round_measures_give_the_optimum(counts: list[int]) -> None:
    judged, full, measured = search_all(counts, calibrate=True, judge=True)
    plan = judged.plan()
    best = min(p.predicted_iteration_time_s for _, p in full.values())
    assert math.isclose(plan.predicted_iteration_time_s, best, rel_tol=1e-9)
    assert all(s.measured for s in plan.stages)
    _, _, by_rounds = search_all(counts, calibrate=True)
    assert measured < by_rounds  # 8 against 10, 8 against 11, 8 against 10


def test_a_count_is_beaten_by_a_measured_plan_of_another_not_by_estimates() -> None:
    counts = [2, 4, 8, 16]
    searches, full = problems(counts)
    multi = MicrobatchSearch(searches, GLOBAL)
    multi.next_round()  # every count's best on its estimates
    assert not any(multi.beaten(b) for b in counts)  # no count has a measured plan yet
    times = {b: plan.predicted_iteration_time_s for b, (_, plan) in full.items()}
    fastest, slowest = min(times, key=times.__getitem__), max(times, key=times.__getitem__)
    results, plan = full[fastest]
    for stage in plan.stages:
        key = stage_key(stage)
        multi.add(fastest, [key], results[key])
    assert not multi.beaten(fastest)  # its own plan does not beat it
    assert not any(multi.beaten(b) for b in counts)  # the others' estimates are lower still
    for key, result in full[slowest][0].items():  # every stage of the slowest count measured
        multi.add(slowest, [key], result)
    assert multi.beaten(slowest)
    assert multi.dropped[slowest].endswith(f"of {fastest} micro-batches ({times[fastest]:.6g} s)")
    assert slowest not in multi.live
    assert not multi.next_round().get(slowest)  # stopped: never asks again


def test_a_count_far_behind_in_a_round_waits_for_the_next_and_is_not_stopped() -> None:
    counts = [2, 4, 8, 16]
    searches, full = problems(counts)
    multi = MicrobatchSearch(searches, GLOBAL)
    first = multi.next_round()
    lows = {b: multi._optimistic_best(b) for b in counts}
    lowest = min(lows, key=lows.__getitem__)
    far = {b for b in counts if lows[b] > lows[lowest] * (1 + searches[lowest].band())}
    assert far == {16} and 16 not in first  # held back at the round's start too (`_defer`)
    assert [multi.held_back(b) for b in counts] == [b in far for b in counts]
    assert multi.live == set(counts) and not multi.dropped  # waiting stops nothing
    for count, keys in first.items():  # the round measured
        for key in keys:
            multi.add(count, [key], full[count][0][key])
    assert 16 in multi.next_round() and not multi.held  # asked again, judged anew
