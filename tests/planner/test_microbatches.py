"""The number of micro-batches as a plan dimension (planner.microbatches).

A brute force over (partition x config x count) on small synthetic tables, each count's
stages at its own micro-batch size, equals the search; the estimate search over counts
gives the optimum of the full tables; the plan with counts searched is never slower in
simulated time than the plan at any fixed count of the set."""

import math
import random

import pytest

from planner import EstimateSearch, NoFeasiblePlan, build_plan, enumerate_candidates
from planner.layer_profiles import is_profiled, with_layer_profiles
from planner.microbatches import MicrobatchSearch, choose_count
from planner.stages import simulate_stages
from planner.table import build_cost_table
from schemas import ClusterSpec, ModelSpec, PlanOptions, StageProfileResult, VarSpec
from tests.planner.brute_force import all_plans
from tests.planner.helpers import cluster, programless_chain_spec
from tests.support.profiles import fake_profile

GLOBAL = 16
MEMORY = 10_000


def device_cluster() -> ClusterSpec:
    """1 x 4 devices of MEMORY bytes (results are judged on the job's device memory)."""
    return cluster(1, 4).model_copy(update={"device_memory_bytes": MEMORY})


OVERHEAD = 0.3e-3


def chain(num_layers: int, size: int, classes: list[str] | None = None) -> ModelSpec:
    """A chain of programless layers whose batch vars are `size` samples."""
    spec = programless_chain_spec(num_layers)

    def at(v: VarSpec) -> VarSpec:
        return v.model_copy(update={"shape": (size, *v.shape[1:])}) if v.shape else v

    layers = [
        x.model_copy(
            update={
                "inputs": [at(v) for v in x.inputs],
                "outputs": [at(v) for v in x.outputs],
                "fingerprint": classes[i] if classes else f"l{i}",
            }
        )
        for i, x in enumerate(spec.layers)
    ]
    return spec.model_copy(update={"inputs": [at(v) for v in spec.inputs], "layers": layers})


def options(counts: list[int], **kw: object) -> PlanOptions:
    base: dict[str, object] = {
        "num_microbatches": 4,
        "global_batch_size": GLOBAL,
        "microbatch_search": counts,
        "schedule": "1f1b",
        "strategies": ["data"],
        "remat": "as_written",
    }
    return PlanOptions(**(base | kw))  # type: ignore[arg-type]


def law(weights: list[float], size: int, devices: int, config: int, key: tuple) -> dict:
    """A stage's forward seconds and bytes at micro-batch `size`: a per-call overhead plus
    its layers' work on `size` samples split over the devices (less than perfectly), and a
    stash that grows with the size (so memory binds at large micro-batches)."""
    start, end, _, _ = key
    n = end - start + 1
    work = sum(weights[start : end + 1]) * size / devices**0.7
    forward = (OVERHEAD + work) * (1 + 0.15 * config)
    stash = 60 * size * n // devices
    initial = 400 * n // devices
    mns = max(-1, min(2**20, (MEMORY - initial) // max(stash, 1) - 1))
    return {"forward": forward, "stash": stash, "initial": initial, "mns": mns, "n": n}


def truth(
    space, weights: list[float], size: int, gamma: float = 0.0
) -> dict[tuple, StageProfileResult]:
    """Every candidate of `space` measured by `law`; a stage of n > 2 layers slower by the
    length law (n / 2)^gamma."""
    out = {}
    for k in space.keys:
        submesh, config = space.resolve(k)
        key = k.as_tuple()
        x = law(weights, size, submesh.num_devices, k.config_id, key)
        forward = x["forward"] * (x["n"] / 2) ** gamma if x["n"] > 2 else x["forward"]
        out[key] = fake_profile(
            f"{key}@{size}",
            forward=forward,
            backward=2 * forward,
            submesh=submesh,
            config=config,
            num_layers=x["n"],
            initial_var_size=x["initial"],
            intermediate_size=x["stash"],
            available_memory=MEMORY,
            max_n_succ_stages=x["mns"],
            peak=0,
        )
    return out


def count_problem(num_layers: int, weights: list[float], opts: PlanOptions, count: int):
    size = GLOBAL // count
    spec = chain(num_layers, size)
    fixed = opts.at_count(count, size)
    space = enumerate_candidates(spec, device_cluster(), fixed)
    return spec, fixed, space, truth(space, weights, size)


def brute(num_layers: int, weights: list[float], opts: PlanOptions) -> tuple[float, int]:
    """The least simulated 1F1B time over every count, partition and config whose stages
    fit (a stage with q after it keeps q + 1 micro-batches), and its count."""
    best = (math.inf, 0)
    for count in opts.microbatch_counts(GLOBAL // 4):
        spec, fixed, space, results = count_problem(num_layers, weights, opts, count)
        table = build_cost_table(spec, device_cluster(), space, results)
        sizes = [s.num_devices for s in space.submeshes]
        for plan in all_plans(table.dp_cost, sizes, device_cluster().num_devices):
            n = len(plan)
            if any(table.max_n_succ_stages[k] < n - 1 - p for p, k in enumerate(plan)):
                continue
            t = simulate_stages(table, plan, count).iteration_time_s
            best = min(best, (t, count))
    return best


def searched(num_layers: int, weights: list[float], opts: PlanOptions):
    plans = {}
    for count in opts.microbatch_counts(GLOBAL // 4):
        spec, fixed, space, results = count_problem(num_layers, weights, opts, count)
        try:
            plans[count] = build_plan(spec, device_cluster(), fixed, space, results)
        except NoFeasiblePlan as e:
            plans[count] = str(e)
    return plans


@pytest.mark.parametrize("seed", range(6))
def test_the_search_over_counts_equals_a_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    num_layers = rng.choice([3, 4])
    weights = [rng.uniform(0.2e-3, 1.5e-3) for _ in range(num_layers)]
    opts = options([1, 2, 4, 8, 16], config_space="all", strategies=["data", "megatron"])
    expected, expected_count = brute(num_layers, weights, opts)
    plans = searched(num_layers, weights, opts)
    plan = choose_count(plans, GLOBAL)
    assert math.isclose(plan.predicted_iteration_time_s, expected, rel_tol=1e-9)
    assert plan.num_microbatches == expected_count
    assert plan.micro_batch_size == GLOBAL // expected_count
    chosen = [o for o in plan.microbatch_options if o.chosen]
    assert [o.num_microbatches for o in chosen] == [expected_count]
    for option in plan.microbatch_options:  # never slower than any fixed count
        if option.feasible:
            assert option.predicted_iteration_time_s is not None
            assert plan.predicted_iteration_time_s <= option.predicted_iteration_time_s


def test_memory_rules_use_the_count_s_micro_batch_size() -> None:
    """A memory so small that the biggest micro-batches never fit: those counts have no plan
    and say why, and the answer is a count whose stash fits."""
    global MEMORY
    weights = [1e-3] * 3
    opts = options([1, 2, 4, 16])
    saved, MEMORY = MEMORY, 700
    try:
        plans = searched(3, weights, opts)
    finally:
        MEMORY = saved
    assert isinstance(plans[1], str)  # 16 samples per micro-batch: no stage fits
    assert not isinstance(searched(3, weights, opts)[1], str)  # they do with more memory
    plan = choose_count(plans, GLOBAL)
    assert plan.num_microbatches != 1
    by_count = {o.num_microbatches: o for o in plan.microbatch_options}
    assert not by_count[1].feasible and by_count[1].reason


CLASSES = ["embed"] + ["block"] * 6 + ["head"]
WEIGHTS = {"embed": 0.1e-3, "block": 0.5e-3, "head": 0.3e-3}


def test_the_estimate_search_over_counts_gives_the_optimum_of_the_full_tables() -> None:
    opts = options([2, 4, 8, 16], config_space="data_parallel_only")
    weights = [WEIGHTS[c] for c in CLASSES]
    searches, full = {}, {}
    for count in opts.microbatch_counts(GLOBAL // 4):
        size = GLOBAL // count
        spec = chain(len(CLASSES), size, CLASSES)
        fixed = opts.at_count(count, size)
        base = enumerate_candidates(spec, device_cluster(), fixed)
        space, scaled, _ = with_layer_profiles(base, CLASSES)
        results = truth(space, weights, size)
        search = EstimateSearch(spec, device_cluster(), fixed, space, frozenset(scaled))
        for key in [k for k in results if is_profiled(k, CLASSES)]:
            search.add([key], results[key])
        searches[count] = search
        full[count] = (results, build_plan(spec, device_cluster(), fixed, space, results))
    multi = MicrobatchSearch(searches, GLOBAL)
    while wanted := multi.next_round():
        for count, keys in wanted.items():
            for key in keys:
                multi.add(count, [key], full[count][0][key])
    plan = multi.plan()
    best = min(p.predicted_iteration_time_s for _, p in full.values())
    assert math.isclose(plan.predicted_iteration_time_s, best, rel_tol=1e-9)
    assert all(s.measured for s in plan.stages)
    for _, fixed_plan in full.values():  # never slower than the plan at any fixed count
        assert plan.predicted_iteration_time_s <= fixed_plan.predicted_iteration_time_s + 1e-12
    measured = sum(len(s.measured) for s in searches.values())
    assert measured < sum(len(r) for r, _ in full.values())


def test_counts_are_the_divisors_of_the_global_batch() -> None:
    auto = PlanOptions(num_microbatches=4, microbatch_search="auto")
    assert auto.microbatch_counts(6) == [1, 2, 3, 4, 6, 8, 12, 24]
    big = PlanOptions(global_batch_size=256, microbatch_search="auto")
    assert big.microbatch_counts(1) == [1, 2, 4, 8, 16, 32, 64]  # at most 64
    listed = PlanOptions(num_microbatches=4, microbatch_search=[8, 4, 32])
    assert listed.microbatch_counts(8) == [4, 8, 32]
    assert listed.count_sizes(8) == [(4, 8), (8, 4), (32, 1)]  # global batch 32
    assert big.count_sizes(1)[-1] == (64, 4)
    with pytest.raises(ValueError, match=r"\[32\] do not divide the global batch 16"):
        listed.microbatch_counts(4)
    fixed = listed.at_count(8, 8)
    assert (fixed.num_microbatches, fixed.global_batch_size, fixed.microbatch_search) == (
        8,
        32,
        None,
    )
    fixed.check_micro_batch(4)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"microbatch_search": [4, 4]}, "counts must be unique"),
        ({"microbatch_search": []}, "at least 1 item"),
        ({"microbatch_search": [0]}, "greater than or equal to 1"),
        ({"microbatch_search": [3], "global_batch_size": 16}, r"\[3\] do not divide"),
        ({"microbatch_search": "some"}, "auto"),
        (
            {
                "microbatch_search": [2, 4],
                "measure_stages": [{"start": 0, "end": 0, "submesh_id": 0, "config_id": 0}],
            },
            "measure_stages: its keys name config ids of one count's space",
        ),
    ],
)
def test_bad_microbatch_search_is_refused(body: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlanOptions.model_validate(body)


class _Lengths:
    """An estimator's length-law samples (`StageEstimator.length_samples`), as scripted."""

    def __init__(self, samples: list[float]) -> None:
        self.samples = samples
        self.peers: list = []

    def length_samples(self) -> list[float]:
        return self.samples


class _Scripted:
    """An estimate search that answers a scripted series of rounds: each its optimistic best
    and the stages it asks for (none: its best plan is measured, at that time). A round
    taken back (`rounds` lowered) is answered again. `calibrated`: it has a longer stage
    measured (a length-law sample); `costs`: the estimates of its stages; every stage it
    asks for is of its best plan."""

    def __init__(
        self,
        count: int,
        rounds: list[tuple[float, list]],
        band: float = 0.15,
        calibrated: bool = True,
        costs: dict | None = None,
    ):
        self.options = PlanOptions(num_microbatches=count)
        self.script = list(rounds)
        self.rounds = 0
        self.stopped = ""
        self.best_time: float | None = None
        self._band = band
        self.estimator = _Lengths([0.2] if calibrated else [])
        self.best_unmeasured: list = []
        self.estimated_at_choice: dict = dict(costs or {})

    def band(self) -> float:
        return self._band

    def next_round(self) -> list:
        self.rounds += 1
        self.best_time, keys = self.script[min(self.rounds, len(self.script)) - 1]
        self.best_unmeasured = list(keys)
        if not keys:
            self.stopped = "the best plan is measured"
            self.rounds -= 1
        return list(keys)


def test_a_count_far_behind_waits_and_is_stopped_without_measuring() -> None:
    lead = _Scripted(8, [(1.0, [(0, 1, 0, 0)]), (1.1, [])])
    behind = _Scripted(32, [(2.0, [(0, 3, 0, 0)])] * 3)
    multi = MicrobatchSearch({8: lead, 32: behind}, 32)  # type: ignore[dict-item]
    assert multi.next_round() == {8: [(0, 1, 0, 0)]}
    assert multi.deferred == {32} and behind.rounds == 0  # it measured nothing
    assert multi.next_round() == {}
    assert 32 in multi.dropped and "slower than the measured plan of 8" in multi.dropped[32]
    why = multi.why_no_plan(32, NoFeasiblePlan("no combination of measured stages"))
    assert why.startswith("not measured further: its best on estimates (2 s) is slower")
    assert multi.why_no_plan(8, NoFeasiblePlan("none fit")) == "none fit"


def test_a_count_that_waited_is_measured_when_the_lead_turns_out_slower() -> None:
    lead = _Scripted(8, [(1.0, [(0, 1, 0, 0)]), (2.5, [])])
    behind = _Scripted(32, [(2.0, [(0, 3, 0, 0)]), (2.1, [])])
    multi = MicrobatchSearch({8: lead, 32: behind}, 32)  # type: ignore[dict-item]
    assert multi.next_round() == {8: [(0, 1, 0, 0)]}
    assert multi.next_round() == {32: [(0, 3, 0, 0)]}  # 2.0 < the lead's measured 2.5
    assert behind.rounds == 1 and not multi.deferred
    assert multi.next_round() == {}
    assert multi.measured_best == {8: 2.5, 32: 2.1} and not multi.dropped


def test_counts_within_the_band_of_the_lowest_are_measured_together() -> None:
    a = _Scripted(8, [(1.0, [(0, 1, 0, 0)]), (1.0, [])])
    b = _Scripted(16, [(1.14, [(0, 2, 0, 0)]), (1.2, [])])
    multi = MicrobatchSearch({8: a, 16: b}, 32)  # type: ignore[dict-item]
    assert multi.next_round() == {8: [(0, 1, 0, 0)], 16: [(0, 2, 0, 0)]}
    assert not multi.deferred


LONGER = [(0, 1, 0, 0), (2, 6, 0, 0), (7, 11, 0, 0), (12, 17, 0, 0)]


def test_before_a_count_is_calibrated_it_asks_for_its_costliest_longer_stage() -> None:
    costs = {(0, 1, 0, 0): 0.09, (2, 6, 0, 0): 0.03, (7, 11, 0, 0): 0.05, (12, 17, 0, 0): 0.04}
    a = _Scripted(8, [(1.0, LONGER)], calibrated=False, costs=costs)
    b = _Scripted(16, [(1.05, LONGER[:3])], calibrated=False, costs=costs)
    multi = MicrobatchSearch({8: a, 16: b}, 32)  # type: ignore[dict-item]
    assert a.estimator.peers == [b.estimator] and b.estimator.peers == [a.estimator]
    # the pair (0, 1) is the costliest, but says nothing of what longer stages cost
    assert multi.next_round() == {8: [(7, 11, 0, 0)], 16: [(7, 11, 0, 0)]}
    assert not multi.deferred and a.rounds == b.rounds == 1


def test_alone_and_uncalibrated_a_count_asks_for_its_whole_plan() -> None:
    a = _Scripted(8, [(1.0, LONGER)], calibrated=False)
    b = _Scripted(16, [(2.0, LONGER)], calibrated=False)
    multi = MicrobatchSearch({8: a, 16: b}, 32)  # type: ignore[dict-item]
    assert multi.next_round() == {8: LONGER} and multi.deferred == {16}


def test_the_lead_is_verified_whole_a_challenger_its_costliest_stages_first() -> None:
    lead = _Scripted(8, [(1.0, [(0, 1, 0, 0)]), (1.2, [])])
    stages = [(0, 3, 0, 0), (4, 9, 0, 0), (10, 12, 0, 0), (13, 17, 0, 0)]
    costs = {(0, 3, 0, 0): 0.02, (4, 9, 0, 0): 0.05, (10, 12, 0, 0): 0.01, (13, 17, 0, 0): 0.04}
    script = [(1.1, stages), (1.1, stages[::2]), (1.3, [(10, 12, 0, 0)])]
    challenger = _Scripted(32, script, costs=costs)
    multi = MicrobatchSearch({8: lead, 32: challenger}, 32)  # type: ignore[dict-item]
    assert multi.next_round() == {8: [(0, 1, 0, 0)], 32: [(4, 9, 0, 0), (13, 17, 0, 0)]}
    # 8's plan is measured (1.2 s): 32, the only count still asking, is verified whole
    assert multi.next_round() == {32: [(0, 3, 0, 0), (10, 12, 0, 0)]}
    assert multi.next_round() == {}  # its best (1.3 s) is slower than 8's measured plan
    assert 32 in multi.dropped and multi.measured_best == {8: 1.2}


def test_a_challenger_asks_for_its_best_plan_s_stages_before_the_others() -> None:
    lead = _Scripted(8, [(1.0, [(0, 1, 0, 0)])])
    near = [(0, 8, 0, 0), (9, 17, 0, 0), (0, 5, 0, 0)]  # the last: of a plan beside the best
    costs = {(0, 8, 0, 0): 0.02, (9, 17, 0, 0): 0.03, (0, 5, 0, 0): 0.09}
    challenger = _Scripted(32, [(1.1, near)], costs=costs)
    answer = challenger.next_round

    def best_two_first() -> list:
        keys = answer()
        challenger.best_unmeasured = near[:2]
        return keys

    challenger.next_round = best_two_first  # type: ignore[method-assign]
    multi = MicrobatchSearch({8: lead, 32: challenger}, 32)  # type: ignore[dict-item]
    assert multi.next_round() == {8: [(0, 1, 0, 0)], 32: [(9, 17, 0, 0), (0, 8, 0, 0)]}
