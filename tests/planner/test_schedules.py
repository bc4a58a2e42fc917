"""The schedule models against known answers on uniform stages, and the engine's rules."""

import math
import random

import pytest

from planner.schedule import (
    Schedule,
    interleaved_in_flight,
    simulate,
    simulate_1f1b,
    simulate_gpipe,
    simulate_interleaved,
    simulate_zb_h1,
)

CASES = [(2, 1), (2, 4), (3, 3), (4, 8), (5, 7), (8, 16)]


@pytest.mark.parametrize(("p", "m"), CASES)
def test_gpipe_and_1f1b_take_the_same_time_on_uniform_stages(p: int, m: int) -> None:
    # F = B = W = 1: the unsplit backward takes 2
    one, gpipe = simulate_1f1b([1.0] * p, [2.0] * p, m), simulate_gpipe([1.0] * p, [2.0] * p, m)
    assert one.iteration_time_s == gpipe.iteration_time_s == (m + p - 1) * 3.0
    assert one.bubble_fraction == pytest.approx(gpipe.bubble_fraction)


@pytest.mark.parametrize(("p", "m"), CASES)
def test_1f1b_keeps_p_minus_s_in_flight_and_gpipe_keeps_all(p: int, m: int) -> None:
    one, gpipe = simulate_1f1b([1.0] * p, [2.0] * p, m), simulate_gpipe([1.0] * p, [2.0] * p, m)
    assert one.max_activations == [min(p - s, m) for s in range(p)]
    assert gpipe.max_activations == [m] * p


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 2), (2, 3, 4), (4, 2, 8), (4, 4, 8), (3, 2, 9)])
def test_interleaved_bubble_is_p_minus_1_over_v_m_of_the_ideal(p: int, v: int, m: int) -> None:
    # the model's F = 1 and B = 2 cut into v chunks per device group
    sched = simulate_interleaved([1.0 / v] * (p * v), [2.0 / v] * (p * v), m, p)
    ideal = 3.0 * m
    assert (sched.iteration_time_s - ideal) / ideal == pytest.approx((p - 1) / (v * m))
    # the order alone fixes what each chunk keeps
    assert sched.max_activations == interleaved_in_flight(p, v, m)
    assert {e.device_group for e in sched.events} == set(range(p))
    assert all(e.device_group == e.stage % p for e in sched.events)


def test_interleaved_refuses_what_megatron_refuses() -> None:
    with pytest.raises(ValueError, match="multiple of the device groups"):
        simulate_interleaved([1.0] * 4, [1.0] * 4, 3, 2)
    with pytest.raises(ValueError, match="do not split evenly"):
        simulate_interleaved([1.0] * 3, [1.0] * 3, 4, 2)


@pytest.mark.parametrize(("p", "m"), [(2, 4), (3, 9), (4, 8), (4, 4), (5, 7), (8, 16)])
def test_zb_h1_bubble_is_below_a_third_of_1f1b_plus_the_w_tail(p: int, m: int) -> None:
    zb = simulate_zb_h1([1.0] * p, [1.0] * p, [1.0] * p, m)
    one = simulate_1f1b([1.0] * p, [2.0] * p, m)
    ideal = 3.0 * m
    last_b = max(e.end_s for e in zb.events if e.kind == "backward")
    tail = zb.iteration_time_s - last_b  # the W passes left after the last B
    assert tail > 0
    assert zb.iteration_time_s - ideal <= (one.iteration_time_s - ideal) / 3 + tail + 1e-9
    assert zb.iteration_time_s < one.iteration_time_s
    if m >= p:  # the paper's closed form: bubble (p - 1)(F + B - W)
        assert zb.iteration_time_s == pytest.approx(ideal + (p - 1) * (1.0 + 1.0 - 1.0))
    # the activations kept are 1F1B's; no stage has more than p micro-batches before their W
    assert zb.max_activations == one.max_activations
    for s in range(p):
        kept, most = 0, 0
        for e in sorted((e for e in zb.events if e.stage == s), key=lambda e: e.start_s):
            kept += {"forward": 1, "backward": 0, "weight": -1}[e.kind]
            most = max(most, kept)
        assert most <= min(p, m)


def _check_events(
    sched: Schedule,
    f: list[float],
    b: list[float],
    w: list[float] | None,
    m: int,
    groups: list[int],
) -> None:
    num_stages = len(f)
    t = {(e.kind, e.stage, e.microbatch): e for e in sched.events}
    kinds = 3 if w is not None else 2
    assert len(t) == len(sched.events) == kinds * num_stages * m
    for (kind, s, i), e in t.items():
        cost = {"forward": f, "backward": b, "weight": w or []}[kind][s]
        assert e.end_s - e.start_s == pytest.approx(cost)
        assert e.device_group == groups[s]
        if kind == "forward" and s > 0:
            assert e.start_s >= t[("forward", s - 1, i)].end_s - 1e-12
        if kind == "backward":
            assert e.start_s >= t[("forward", s, i)].end_s - 1e-12
            if s < num_stages - 1:
                assert e.start_s >= t[("backward", s + 1, i)].end_s - 1e-12
        if kind == "weight":
            assert e.start_s >= t[("backward", s, i)].end_s - 1e-12
    for g in set(groups):
        spans = sorted((e.start_s, e.end_s) for e in sched.events if e.device_group == g)
        assert all(a[1] <= c[0] + 1e-12 for a, c in zip(spans, spans[1:], strict=False))
    assert sched.iteration_time_s == max(e.end_s for e in sched.events)
    busy = sum(e.end_s - e.start_s for e in sched.events)
    assert sched.bubble_fraction == pytest.approx(
        1 - busy / (len(set(groups)) * sched.iteration_time_s)
    )


@pytest.mark.parametrize("seed", range(6))
def test_events_respect_every_dependency_and_never_overlap_on_a_group(seed: int) -> None:
    rng = random.Random(seed)
    p, m = rng.randint(1, 5), rng.randint(1, 7)
    f = [rng.uniform(0.1, 2) for _ in range(p)]
    b = [rng.uniform(0.1, 2) for _ in range(p)]
    w = [rng.uniform(0.1, 2) for _ in range(p)]
    own = list(range(p))
    _check_events(simulate("1f1b", f, b, m), f, b, None, m, own)
    _check_events(simulate("gpipe", f, b, m), f, b, None, m, own)
    _check_events(simulate("zb-h1", f, b, m, weight=w), f, b, w, m, own)
    groups, v = rng.randint(2, 3), rng.randint(2, 3)
    m2 = groups * rng.randint(1, 3)
    fc = [rng.uniform(0.1, 2) for _ in range(groups * v)]
    bc = [rng.uniform(0.1, 2) for _ in range(groups * v)]
    sched = simulate("interleaved", fc, bc, m2, num_groups=groups)
    _check_events(sched, fc, bc, None, m2, [k % groups for k in range(groups * v)])


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="weight"):
        simulate("zb-h1", [1.0], [1.0], 2)
    with pytest.raises(ValueError, match="weight cost of stage 0"):
        simulate_zb_h1([1.0], [1.0], [math.inf], 2)
    with pytest.raises(ValueError, match="unknown schedule"):
        simulate("dualpipe", [1.0], [1.0], 2)
