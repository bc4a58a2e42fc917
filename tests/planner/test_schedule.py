"""The 1F1B schedule model against hand-computed timelines."""

import math

import pytest

from planner import simulate_1f1b
from planner.schedule import one_f_one_b_order


def timeline(schedule) -> dict[tuple[str, int, int], tuple[float, float]]:
    return {
        (e.kind[0].upper(), e.stage, e.microbatch): (e.start_s, e.end_s) for e in schedule.events
    }


def test_op_order_is_one_forward_one_backward() -> None:
    assert one_f_one_b_order(0, 3, 4) == [
        ("forward", 0),
        ("forward", 1),
        ("forward", 2),
        ("backward", 0),
        ("forward", 3),
        ("backward", 1),
        ("backward", 2),
        ("backward", 3),
    ]
    assert one_f_one_b_order(2, 3, 2) == [
        ("forward", 0),
        ("backward", 0),
        ("forward", 1),
        ("backward", 1),
    ]
    assert one_f_one_b_order(0, 4, 2) == [
        ("forward", 0),
        ("forward", 1),
        ("backward", 0),
        ("backward", 1),
    ]


def test_three_stages_by_hand() -> None:
    # forward (1, 2, 1) s, backward (2, 3, 1) s, B = 2.
    # stage 0 order F0 F1 B0 B1; stage 1: F0 F1 B0 B1; stage 2: F0 B0 F1 B1.
    # F(0,0) 0-1   F(0,1) 1-2
    # F(1,0) 1-3   (after F(0,0))          F(1,1) 3-5   (stage 1 busy until 3)
    # F(2,0) 3-4   B(2,0) 4-5              F(2,1) 5-6 (after F(1,1))   B(2,1) 6-7
    # B(1,0) 5-8   (after F(1,1) and B(2,0))  B(1,1) 8-11 (stage 1 busy until 8)
    # B(0,0) 8-10  (after B(1,0))          B(0,1) 11-13 (after B(1,1))
    # busy = 2 * (3 + 5 + 2) = 20 stage-seconds of 3 * 13 = 39.
    schedule = simulate_1f1b([1.0, 2.0, 1.0], [2.0, 3.0, 1.0], 2)
    assert timeline(schedule) == {
        ("F", 0, 0): (0, 1),
        ("F", 0, 1): (1, 2),
        ("F", 1, 0): (1, 3),
        ("F", 1, 1): (3, 5),
        ("F", 2, 0): (3, 4),
        ("B", 2, 0): (4, 5),
        ("F", 2, 1): (5, 6),
        ("B", 2, 1): (6, 7),
        ("B", 1, 0): (5, 8),
        ("B", 1, 1): (8, 11),
        ("B", 0, 0): (8, 10),
        ("B", 0, 1): (11, 13),
    }
    assert schedule.iteration_time_s == 13.0
    assert math.isclose(schedule.bubble_fraction, 1 - 20 / 39)


def test_uniform_stages_give_the_textbook_bubble() -> None:
    # S stages of equal f, b: iteration (B + S - 1)(f + b), bubble (S - 1) / (B + S - 1)
    for stages, micro in [(3, 3), (4, 8), (2, 1), (1, 5)]:
        schedule = simulate_1f1b([1.0] * stages, [2.0] * stages, micro)
        assert math.isclose(schedule.iteration_time_s, (micro + stages - 1) * 3.0)
        assert math.isclose(schedule.bubble_fraction, (stages - 1) / (micro + stages - 1))
        assert len(schedule.events) == 2 * stages * micro


def test_events_respect_dependencies_and_never_overlap() -> None:
    f, b, micro = [0.3, 1.1, 0.2, 0.7], [0.5, 2.0, 0.1, 0.9], 5
    schedule = simulate_1f1b(f, b, micro)
    t = timeline(schedule)
    for (kind, s, i), (start, end) in t.items():
        assert math.isclose(end - start, (f if kind == "F" else b)[s])
        if kind == "F" and s > 0:
            assert start >= t[("F", s - 1, i)][1]
        if kind == "B":
            assert start >= t[("F", s, i)][1]
            if s < len(f) - 1:
                assert start >= t[("B", s + 1, i)][1]
    for s in range(len(f)):
        spans = sorted(v for k, v in t.items() if k[1] == s)
        assert all(a[1] <= c[0] + 1e-12 for a, c in zip(spans, spans[1:], strict=False))
    assert schedule.iteration_time_s == max(e for _, e in t.values())


@pytest.mark.parametrize(
    ("f", "b", "micro"),
    [([], [], 2), ([1.0], [1.0, 2.0], 2), ([1.0], [1.0], 0), ([float("nan")], [1.0], 2)],
)
def test_bad_schedule_input_is_refused(f: list[float], b: list[float], micro: int) -> None:
    with pytest.raises(ValueError):
        simulate_1f1b(f, b, micro)


def test_zero_costs() -> None:
    schedule = simulate_1f1b([0.0, 0.0], [0.0, 0.0], 3)
    assert schedule.iteration_time_s == 0.0 and schedule.bubble_fraction == 0.0
