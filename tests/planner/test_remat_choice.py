"""The planner chooses each stage's remat variant with the schedule, under its memory rule:
against a brute force over every partition × per-stage variant assignment."""

import itertools
import math
import random

import numpy as np
import pytest

from planner import NoFeasiblePlan, build_plan, enumerate_candidates, remat_choices
from planner.plan import config_ranks
from planner.remat import as_written_sibling, remat_worth_measuring
from planner.search import proposals
from planner.table import build_cost_table
from schemas import PlanOptions, ProfileStatus, RematVariant
from schemas.candidate_count import count_candidates
from tests.planner.brute_force import all_plans
from tests.planner.helpers import MEMORY_SCALE, SMALL_DEVICE, cluster, split_result
from tests.planner.helpers import programless_chain_spec as chain_spec
from tests.planner.test_schedule_search import brute

VARIANTS = ("as_written", "full", "dots")
# per variant: (backward time factor, stash factor): recomputation trades time for memory
TRADE = {"as_written": (1.0, 1.0), "dots": (1.15, 0.4), "full": (1.35, 0.08)}


def remat_spec(num_layers: int):
    spec = chain_spec(num_layers)
    fake = RematVariant(forward="", backward="")
    layers = [
        layer.model_copy(update={"remat_variants": {"full": fake, "dots": fake}})
        for layer in spec.layers
    ]
    return spec.model_copy(update={"layers": layers})


def remat_results(space, rng: random.Random, memory: str):
    """Random measurements where a variant's stage is slower in backward and stashes less
    than its as-written sibling (same draw); `memory`: "ample", "tight" (binds) or "none"
    (no as-written stage keeps even one micro-batch)."""
    base: dict = {}
    out = {}
    for key in space.keys:
        submesh, config = space.resolve(key)
        n = key.end - key.start + 1
        sib = (
            key.start,
            key.end,
            key.submesh_id,
            config.model_copy(update={"remat": "as_written"}).label(),
        )
        if sib not in base:
            f = n * rng.uniform(0.5, 1.5) / submesh.num_devices
            base[sib] = (
                f,
                f * rng.uniform(0.5, 1.5),
                f * rng.uniform(0.3, 1.2),
                rng.randint(1000, 3000),
                rng.randint(0, 2000),
                {"ample": 10, "tight": rng.randint(600, 3000), "none": rng.randint(9001, 12000)}[
                    memory
                ],
            )
        f, b, w, peak, initial, inter = base[sib]
        slow, small = TRADE[config.remat]
        out[key.as_tuple()] = split_result(
            submesh,
            config,
            f,
            b * slow,
            w,
            num_layers=n,
            available=SMALL_DEVICE,
            peak=peak * MEMORY_SCALE,
            initial=initial * MEMORY_SCALE,
            intermediate=max(1, int(inter * small)) * MEMORY_SCALE,
            weight_stash=5 * MEMORY_SCALE,
        )
    return out


def brute_assignments(name: str, table, space, devices: int, micro: int) -> float:
    """1f1b / gpipe: every partition over as-written configs, then every assignment of a
    variant to each of its stages, under the schedule's memory rule."""
    sizes = [s.num_devices for s in space.submeshes]
    variant_key = {}
    for m, configs in enumerate(space.configs):
        for c, config in enumerate(configs):
            plain = config.model_copy(update={"remat": "as_written"})
            variant_key[m, configs.index(plain), config.remat] = c
    # every partition over as-written configs (measured or not: variants may be)
    shape_cost = np.full(table.dp_cost.shape, math.inf)
    for m, configs in enumerate(space.configs):
        for c, config in enumerate(configs):
            if config.remat == "as_written":
                shape_cost[:, :, m, c] = 1.0
    best = math.inf
    for plan in all_plans(shape_cost, sizes, devices):
        n = len(plan)
        for assignment in itertools.product(VARIANTS, repeat=n):
            keys = [
                (i, e, m, variant_key[m, c, v])
                for (i, e, m, c), v in zip(plan, assignment, strict=True)
            ]
            if not all(math.isfinite(table.dp_cost[k]) for k in keys):
                continue
            need = [n - 1 - p if name == "1f1b" else micro - 1 for p in range(n)]
            if any(table.max_n_succ_stages[k] < q for k, q in zip(keys, need, strict=True)):
                continue
            costs = [float(table.dp_cost[k]) for k in keys]
            best = min(best, sum(costs) + (micro - 1) * max(costs))
    return best


def _setup(seed: int, tight: bool | str, micro: int = 4):
    rng = random.Random(seed)
    spec, clu = remat_spec(3), cluster(1, 4, SMALL_DEVICE)
    options = PlanOptions(num_microbatches=micro, strategies=["data"])
    space = enumerate_candidates(spec, clu, options)
    memory = tight if isinstance(tight, str) else ("tight" if tight else "ample")
    table = build_cost_table(spec, clu, space, remat_results(space, rng, memory))
    return spec, clu, options, space, table


@pytest.mark.parametrize("tight", [True, False])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", ["1f1b", "gpipe"])
def test_each_stage_s_variant_equals_a_brute_force_over_assignments(name, seed, tight) -> None:
    _, _, _, space, table = _setup(seed * 11 + len(name), tight)
    found, _ = proposals(name, table, space, 4, 4, config_ranks(space))
    expected = brute_assignments(name, table, space, 4, 4)
    got = min((value for value, *_ in found), default=math.inf)
    if math.isinf(expected):
        assert not found
    else:
        assert got == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("tight", [True, False])
@pytest.mark.parametrize("name", ["zb-h1", "interleaved"])
def test_split_and_interleaved_searches_cover_the_variants(name, tight) -> None:
    _, _, _, space, table = _setup(5 + len(name), tight)
    found, _ = proposals(name, table, space, 4, 4, config_ranks(space))
    expected = brute(name, table, space, 4, 4)
    got = min((value for value, *_ in found), default=math.inf)
    assert got == pytest.approx(expected, rel=1e-9) if math.isfinite(expected) else not found


def test_ample_memory_plans_without_remat_and_tight_memory_with_it() -> None:
    spec, clu, options, space, table = _setup(1, tight=False)
    results = {k: table.results[k] for k in table.results}
    plan = build_plan(spec, clu, options, space, results)
    assert {s.remat for s in plan.stages} == {"as_written"}
    spec, clu, options, space, table = _setup(2, tight="none")
    results = dict(table.results)
    written = options.model_copy(update={"remat": "as_written"})
    plain = {k: r for k, r in results.items() if not space.is_remat(k)}
    with pytest.raises(NoFeasiblePlan, match=r"memory ignored: layers 0-\d.* misses by [\d.]+ MiB"):
        build_plan(spec, clu, written, enumerate_candidates(spec, clu, written), plain)
    plan = build_plan(spec, clu, options, space, results)
    assert {s.remat for s in plan.stages} <= {"full", "dots"}
    assert all(s.remat == s.config.remat for s in plan.stages)


def test_remat_choices_and_what_is_worth_measuring() -> None:
    spec = remat_spec(3)
    assert remat_choices(spec, "auto") == list(VARIANTS)
    assert remat_choices(spec, "full") == ["full"]
    assert remat_choices(chain_spec(3), "auto") == ["as_written"]
    with pytest.raises(ValueError, match="carries the 'dots' variant"):
        remat_choices(chain_spec(3), "dots")
    clu, options = (
        cluster(1, 4, SMALL_DEVICE),
        PlanOptions(num_microbatches=4, strategies=["data"], schedule="1f1b"),
    )
    space = enumerate_candidates(spec, clu, options)
    key = next(k.as_tuple() for k in space.keys if space.is_remat(k) and k.end == 0)
    sib = as_written_sibling(space, key)
    assert sib is not None and sib[:3] == key[:3] and not space.is_remat(sib)
    submesh, config = space.resolve(sib)

    def result(intermediate: int):
        return split_result(
            submesh,
            config,
            1.0,
            1.0,
            1.0,
            available=SMALL_DEVICE,
            peak=1000 * MEMORY_SCALE,
            initial=0,
            intermediate=intermediate * MEMORY_SCALE,
        )

    n = 3  # stages that could follow layer 0 on a one-device submesh: min(2 layers, 3 devices)
    assert not remat_worth_measuring(key, space, {}, 3, clu, options)  # sibling pruned
    oom = result(100).model_copy(update={"status": ProfileStatus.oom})
    assert remat_worth_measuring(key, space, {sib: oom}, 3, clu, options)
    room = {sib: result(100)}  # max_n_succ_stages = 89
    assert not remat_worth_measuring(key, space, room, 3, clu, options)
    cramped = {sib: result(9000 // (n - 1))}  # max_n_succ_stages = 1 < 2
    assert remat_worth_measuring(key, space, cramped, 3, clu, options)
    # measured by a job with 1 GiB devices: room there, none on this job's devices
    stored = result(9000 // (n - 1)).for_device_memory(2**30)
    assert stored.max_n_succ_stages > n
    assert remat_worth_measuring(key, space, {sib: stored}, 3, clu, options)
    gpipe = options.model_copy(update={"schedule": "gpipe"})
    assert remat_worth_measuring(key, space, {sib: result(9000 // 3)}, 3, clu, gpipe)
    assert remat_worth_measuring(sib, space, {}, 3, clu, options)


@pytest.mark.parametrize("remat", ["auto", "as_written", "full"])
def test_the_candidate_count_counts_the_variants(remat: str) -> None:
    spec, clu = remat_spec(4), cluster(2, 4)
    options = PlanOptions(num_microbatches=4, remat=remat)
    want = len(enumerate_candidates(spec, clu, options).keys)
    n = len(remat_choices(spec, remat))
    got = count_candidates(4, clu, options, spec.micro_batch_size, None, n)
    assert got.total == want == n * count_candidates(4, clu, options, spec.micro_batch_size).total
