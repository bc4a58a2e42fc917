"""Adjacent pairs measured up front on the reference submesh and config only
(`planner.estimate.REFERENCE`): elsewhere a pair is its two layers plus the reference's
boundary scaled, and the per-call overhead of a config with one-layer profiles only comes
from the reference's fit. Checked against the cost law of `test_estimate_search`, whose
overhead is the same on every submesh and whose layers' times scale alike: there the
borrowed pairs are the truth, and the search still answers the exhaustive optimum (the
tests of `test_estimate_search` run with these layer profiles)."""

import math

import numpy as np
import pytest

from planner import EstimateSearch, build_plan, enumerate_candidates, with_layer_profiles
from planner.layer_profiles import REFERENCE, is_profiled
from planner.time_model import fit_singles, predict
from schemas import ProfileStatus
from tests.planner.test_estimate_search import (
    CLASSES,
    CLUSTER,
    _options,
    _run,
    _spec,
    _truth,
)
from tests.support.profiles import fake_profile

OVERHEAD = 0.15  # the reference's fitted overhead in the unit tests of `fit_singles`


def test_pairs_are_measured_up_front_on_the_reference_only() -> None:
    search, truth, _ = _run("1f1b")
    up_front = [k for k in truth if is_profiled(k, CLASSES)]
    pairs = sorted(k for k in up_front if k[1] == k[0] + 1)
    # embed-block and block-head, on one device only; every layer on every submesh/config
    assert pairs == [(0, 1, *REFERENCE), (10, 11, *REFERENCE)]
    meshes = {k[2:] for k in truth}
    assert len(meshes) > 1
    assert {k[2:] for k in up_front if k[0] == k[1]} == meshes
    others = [k for k in truth if k[1] == k[0] + 1 and k[2:] != REFERENCE]
    assert others and not any(is_profiled(k, CLASSES) for k in others)


def test_a_pair_off_the_reference_is_its_layers_plus_the_reference_boundary() -> None:
    search, truth, _ = _run("1f1b")
    point = search.point_table()
    checked = 0
    for key in (k for k in truth if k[1] == k[0] + 1 and k[2:] != REFERENCE):
        if key in search.measured:
            continue
        est = search.estimator.estimate(key)
        assert est is not None, key
        assert math.isclose(est.compute_cost, truth[key].compute_cost, rel_tol=1e-9)
        assert est.intermediate_size == truth[key].intermediate_size
        assert est.initial_var_size == truth[key].initial_var_size
        # the table of estimates borrows the same boundary
        assert math.isclose(point.table.forward[key], est.forward_cost, rel_tol=1e-9)
        checked += 1
    assert checked > 0


def test_longer_stages_off_the_reference_are_estimated_exactly() -> None:
    """The overhead taken from the reference is the law's own: a stage of any length on a
    submesh without pairs measured is the truth."""
    search, truth, _ = _run("1f1b")
    for key in [k for k in search.scaled if k[0] == k[1]]:  # measured on demand
        search.add([key], truth[key])
    longer = [k for k in truth if k[1] - k[0] >= 3 and k[2:] != REFERENCE]
    assert longer
    for key in longer:
        if key in search.measured:
            continue
        est = search.estimator.estimate(key)
        assert est is not None
        assert math.isclose(est.compute_cost, truth[key].compute_cost, rel_tol=1e-6)


@pytest.mark.parametrize(
    ("here", "overhead"),
    [
        # per-layer times halved, overhead unchanged: the reference's overhead is larger
        # than its share of the faster layers
        ([OVERHEAD + 0.1, OVERHEAD + 0.5], OVERHEAD),
        # everything three times slower: the share (3x the overhead) is larger
        ([3 * (OVERHEAD + 0.2), 3 * (OVERHEAD + 1.0)], 3 * OVERHEAD),
        # layers faster than the reference's overhead: at most the fastest layer's time
        ([0.05, 0.08], 0.05),
    ],
)
def test_the_borrowed_overhead_is_the_larger_guess(here: list[float], overhead: float) -> None:
    reference = np.array([OVERHEAD, 0.2, 1.0])
    classes = [0, 1]
    rows = [(0, 0, here[0]), (1, 1, here[1])]
    coef = fit_singles(rows, classes, 2, reference)
    assert coef is not None
    assert math.isclose(coef[0], overhead, rel_tol=1e-9)
    for k in (0, 1):  # one-layer stages stay what was measured
        assert math.isclose(predict(coef, classes, k, k), here[k], rel_tol=1e-9)
    assert min(coef[1:]) >= 0
    assert fit_singles([], classes, 2, reference) is None


def test_a_pair_the_reference_cannot_hold_is_measured_on_every_submesh() -> None:
    """The embed-block pair (and every longer stage holding it) runs out of memory on one
    device: with no boundary to borrow there, that pair is measured on every other submesh
    and config (as every pair was before), and the search still answers the optimum of the
    whole true table."""
    spec, options = _spec(), _options("1f1b")
    space, scaled, _ = with_layer_profiles(
        enumerate_candidates(spec, CLUSTER, options), [x.fingerprint for x in spec.layers]
    )
    devices = [m.num_devices for m in space.submeshes]
    truth = {k.as_tuple(): _truth(k.as_tuple(), devices[k.submesh_id], {}) for k in space.keys}
    failed = (0, 1, *REFERENCE)
    for key in [k for k in truth if k[0] == 0 and k[1] >= 1 and k[2:] == REFERENCE]:
        truth[key] = fake_profile(f"oom{key}", ProfileStatus.oom, num_layers=key[1] + 1)
    search = EstimateSearch(spec, CLUSTER, options, space, frozenset(scaled))
    for key in [k for k in truth if is_profiled(k, CLASSES)]:
        search.add([key], truth[key])
    first = search.next_round()
    assert first == sorted(k for k in truth if k[:2] == (0, 1) and k != failed)
    for key in first:
        search.add([key], truth[key])
    while keys := search.next_round():
        for key in keys:
            search.add([key], truth[key])
    plan = search.plan()
    reference = build_plan(spec, CLUSTER, options, search.space, truth)
    assert math.isclose(plan.predicted_iteration_time_s, reference.predicted_iteration_time_s)
    assert all(s.measured for s in plan.stages)
