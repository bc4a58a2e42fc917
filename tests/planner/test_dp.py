"""The stage DP against brute-force enumeration, hand-made cases, and bad input."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import inference_dp, training_dp
from planner.reference import training_dp_loops
from tests.planner.brute_force import brute_inference, brute_training

SUBMESH_SETS = [
    [(1, 1)],
    [(1, 1), (1, 2)],
    [(1, 1), (1, 2), (1, 4)],
    [(1, 1), (1, 2), (2, 2)],
    [(1, 2), (1, 3)],
    [(1, 4), (1, 1)],
]


@st.composite
def instances(draw: st.DrawFn, memory: bool) -> dict:
    """A small random table: ties, missing entries, and (optionally) tight memory limits."""
    num_layers = draw(st.integers(1, 5))
    submeshes = draw(st.sampled_from(SUBMESH_SETS))
    num_configs = draw(st.integers(1, 3))
    shape = (num_layers, num_layers, len(submeshes), num_configs)
    size = int(np.prod(shape))
    values = st.one_of(
        st.integers(0, 6).map(float),  # many ties
        st.floats(0.0, 10.0, allow_nan=False),
        st.just(math.inf),
    )
    cost = np.array(draw(st.lists(values, min_size=size, max_size=size))).reshape(shape)
    mns = None
    if memory:
        limits = draw(st.lists(st.integers(-1, 4), min_size=size, max_size=size))
        mns = np.array(limits).reshape(shape)
    return {
        "cost": cost,
        "mns": mns,
        "submeshes": submeshes,
        "sizes": [h * d for h, d in submeshes],
        "devices": draw(st.integers(1, 5)),
        "microbatches": draw(st.integers(1, 8)),
    }


def check_plan(inst: dict, stages: list[tuple[int, int, int, int]]) -> None:
    """A returned plan covers the layers in order, uses every device, obeys memory."""
    num_layers = inst["cost"].shape[0]
    assert stages[0][0] == 0 and stages[-1][1] == num_layers - 1
    for (_, end, _, _), (start, _, _, _) in zip(stages, stages[1:], strict=False):
        assert start == end + 1
    assert sum(inst["sizes"][m] for _, _, m, _ in stages) == inst["devices"]
    for p, key in enumerate(stages):
        assert math.isfinite(inst["cost"][key])
        if inst["mns"] is not None:
            assert len(stages) - 1 - p <= inst["mns"][key]


def same(a: float, b: float) -> bool:
    return (math.isinf(a) and math.isinf(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(memory=False))
def test_training_dp_matches_brute_force(inst: dict) -> None:
    result = training_dp(
        inst["cost"], inst["mns"], inst["submeshes"], inst["devices"], inst["microbatches"]
    )
    expected = brute_training(
        inst["cost"], inst["mns"], inst["sizes"], inst["devices"], inst["microbatches"]
    )
    assert same(result.cost, expected), (result, expected)
    if math.isfinite(expected):
        check_plan(inst, result.stages)
        costs = [inst["cost"][k] for k in result.stages]
        assert same(sum(costs) + (inst["microbatches"] - 1) * max(costs), result.cost)
    else:
        assert result.stages == []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(memory=True))
def test_training_dp_memory_limited_matches_brute_force(inst: dict) -> None:
    result = training_dp(
        inst["cost"], inst["mns"], inst["submeshes"], inst["devices"], inst["microbatches"]
    )
    expected = brute_training(
        inst["cost"], inst["mns"], inst["sizes"], inst["devices"], inst["microbatches"]
    )
    assert same(result.cost, expected), (result, expected)
    if math.isfinite(expected):
        check_plan(inst, result.stages)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(memory=True))
def test_inference_dp_matches_brute_force(inst: dict) -> None:
    result = inference_dp(inst["cost"], inst["mns"], inst["submeshes"], inst["devices"])
    expected = brute_inference(inst["cost"], inst["mns"], inst["sizes"], inst["devices"])
    assert same(result.cost, expected), (result, expected)
    if math.isfinite(expected):
        assert max(inst["cost"][k] for k in result.stages) == result.cost
        assert all(inst["mns"][k] >= 0 for k in result.stages)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(memory=True))
def test_alpa_loops_agree_when_costs_are_spaced(inst: dict) -> None:
    """Alpa's own walk (gap 1e-6 between bounds) is exact when costs are whole numbers >= 1."""
    cost = np.where(np.isfinite(inst["cost"]), np.floor(inst["cost"]) + 1, np.inf)
    args = (cost, inst["mns"], inst["submeshes"], inst["devices"], inst["microbatches"])
    assert same(training_dp_loops(*args).cost, training_dp(*args).cost)


def two_layer_table(whole: float) -> np.ndarray:
    """2 layers, submeshes (1,1) and (1,2), one config: 1 s per layer on one device,
    `whole` s for both layers on two devices."""
    cost = np.full((2, 2, 2, 1), np.inf)
    cost[0, 0, 0, 0] = 1.0
    cost[1, 1, 0, 0] = 1.0
    cost[0, 1, 1, 0] = whole
    return cost


@pytest.mark.parametrize(
    ("whole", "cost", "stages"),
    [
        # two stages: 1 + 1 + 3 * 1 = 5; one stage: 4 * 1.5 = 6
        (1.5, 5.0, [(0, 0, 0, 0), (1, 1, 0, 0)]),
        # one stage: 4 * 1.2 = 4.8 < 5
        (1.2, 4.8, [(0, 1, 1, 0)]),
    ],
    ids=["pipeline when micro-batches are many", "one stage when it is fast enough"],
)
def test_pipeline_or_one_stage(whole: float, cost: float, stages: list[tuple]) -> None:
    result = training_dp(two_layer_table(whole), None, [(1, 1), (1, 2)], 2, 4)
    assert math.isclose(result.cost, cost)
    assert result.stages == stages


def test_memory_rule_forbids_stages_after_a_big_stage() -> None:
    mns = np.full((2, 2, 2, 1), 8)
    mns[0, 0, 0, 0] = 0  # the first layer's stage cannot have a stage after it
    result = training_dp(two_layer_table(1.5), mns, [(1, 1), (1, 2)], 2, 4)
    assert result.stages == [(0, 1, 1, 0)]
    assert result.cost == 6.0


def test_every_device_must_be_used() -> None:
    # 3 devices: (1,1) + (1,2) is the only way; the one-stage 2-device plan is not allowed
    cost = two_layer_table(0.1)
    cost[1, 1, 1, 0] = 2.0
    result = training_dp(cost, None, [(1, 1), (1, 2)], 3, 2)
    assert result.stages == [(0, 0, 0, 0), (1, 1, 1, 0)]
    assert result.cost == 1.0 + 2.0 + 2.0


def test_cheapest_config_is_picked() -> None:
    cost = np.full((1, 1, 1, 3), np.inf)
    cost[0, 0, 0] = [3.0, 1.0, 2.0]
    result = training_dp(cost, None, [(1, 1)], 1, 2)
    assert result.stages == [(0, 0, 0, 1)] and result.cost == 2.0


def test_all_infeasible_gives_no_plan() -> None:
    cost = np.full((3, 3, 2, 2), np.inf)
    result = training_dp(cost, None, [(1, 1), (1, 2)], 2, 4)
    assert not result.feasible and result.stages == []
    mns = np.full(cost.shape, -1)
    result = training_dp(np.ones(cost.shape), mns, [(1, 1), (1, 2)], 2, 4)
    assert not result.feasible and result.stages == []
    assert not inference_dp(cost, None, [(1, 1), (1, 2)], 2).feasible


def test_nan_is_refused_with_its_position() -> None:
    cost = np.ones((2, 2, 1, 1))
    cost[1, 1, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"NaN at .*\(1, 1, 0, 0\)"):
        training_dp(cost, None, [(1, 1)], 1, 2)
    mns = np.zeros((2, 2, 1, 1))
    mns[0, 1, 0, 0] = np.nan
    with pytest.raises(ValueError, match="max_n_succ_stages is NaN"):
        training_dp(np.ones((2, 2, 1, 1)), mns, [(1, 1)], 1, 2)


@pytest.mark.parametrize(
    ("cost", "mns", "submeshes", "message"),
    [
        (-np.ones((1, 1, 1, 1)), None, [(1, 1)], "negative"),
        (np.ones((2, 1, 1, 1)), None, [(1, 1)], "shape"),
        (np.ones((1, 1, 2, 1)), None, [(1, 1)], "submesh choices"),
        (np.ones((1, 1, 1, 1)), np.ones((1, 1, 1, 2)), [(1, 1)], "max_n_succ_stages has shape"),
    ],
)
def test_bad_input_is_refused(cost: np.ndarray, mns, submeshes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        training_dp(cost, mns, submeshes, 1, 2)


def test_lower_triangle_is_ignored() -> None:
    cost = np.zeros((2, 2, 1, 1))
    cost[0, 1, 0, 0] = 5.0  # (start=1, end=0) would be free but is not a stage
    result = training_dp(cost, None, [(1, 1)], 1, 1)
    assert result.stages == [(0, 1, 0, 0)] and result.cost == 5.0


def test_inference_dp_minimises_the_largest_stage() -> None:
    # one stage on 2 devices: 1.5; two stages on 1 device each: max(1, 1) = 1
    result = inference_dp(two_layer_table(1.5), None, [(1, 1), (1, 2)], 2)
    assert result.cost == 1.0 and result.stages == [(0, 0, 0, 0), (1, 1, 0, 0)]
    mns = np.full((2, 2, 2, 1), 5)
    mns[1, 1, 0, 0] = -1  # the second layer alone does not fit on one device
    result = inference_dp(two_layer_table(1.5), mns, [(1, 1), (1, 2)], 2)
    assert result.cost == 1.5 and result.stages == [(0, 1, 1, 0)]


def test_inputs_are_not_modified() -> None:
    cost = np.random.default_rng(0).random((3, 3, 2, 2))
    before = cost.copy()
    training_dp(cost, None, [(1, 1), (1, 2)], 2, 4)
    np.testing.assert_array_equal(cost, before)


def test_plan_of_many_stages_with_memory_rows() -> None:
    # 6 layers on 6 single devices: only the all-singles plan uses every device; the memory
    # rule lets stage p have 5 - p stages after it only when its limit allows.
    cost = np.full((6, 6, 1, 1), np.inf)
    for i in range(6):
        cost[i, i, 0, 0] = 1.0 + i
    mns = np.full(cost.shape, 5)
    result = training_dp(cost, mns, [(1, 1)], 6, 3)
    assert result.stages == [(i, i, 0, 0) for i in range(6)]
    assert result.cost == sum(range(1, 7)) + 2 * 6.0
    mns[2, 2, 0, 0] = 2  # layer 2's stage has 3 stages after it: too many
    assert not training_dp(cost, mns, [(1, 1)], 6, 3).feasible
