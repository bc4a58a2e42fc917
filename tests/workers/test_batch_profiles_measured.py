"""Layer profiles interpolated between micro-batch sizes (planner.batch_profiles) against
real measurements: the tiny GPT traced once with a symbolic batch, each layer's stage (and
the embedding-block pair) measured at micro-batch 1, 2 and 4 on virtual CPU devices; the
profile at 2 interpolated from 1 and 4 has the measured FLOPs, stash and parameter bytes
(structural, exact up to rounding) and a peak near the measured one. Times are printed, not
asserted (a shared machine's timings are noise at this size)."""

import pytest

from client.symbolic_batch import build_zoo_symbolic
from planner.batch_profiles import interpolate
from programs import spec_at_batch
from schemas import ClusterSpec, ModelSpec, ShardingConfig, StageProfileResult, SubmeshShape
from tests.support.models import FAST_OPTIONS, TINY_GPT
from workers.measure.stage import measure_stage_on

CLUSTER = ClusterSpec(num_hosts=1, devices_per_host=2)
SIZES = (1, 2, 4)


@pytest.fixture(scope="module")
def measured() -> dict[tuple[int, int, int, int], StageProfileResult]:
    """(start, end, devices, size) -> result: every layer alone and layers 0-1, on one
    device and on two (data parallel, sizes 2 and 4 only: 2 must divide the batch)."""
    spec: ModelSpec = build_zoo_symbolic("gpt", remat_variants=(), num_layers=1, **TINY_GPT)
    out = {}
    for size in SIZES:
        at = spec_at_batch(spec, size)
        ranges = [(k, k) for k in range(at.num_layers)] + [(0, 1)]
        for devices in (1, 2):
            if size % devices:
                continue
            submesh = SubmeshShape(hosts=1, devices_per_host=devices)
            config = ShardingConfig(logical_mesh=(devices, 1), strategy="data")
            for a, b in ranges:
                result = measure_stage_on(at, a, b, submesh, config, CLUSTER, FAST_OPTIONS)
                assert result.ok, result.error
                out[(a, b, devices, size)] = result
    return out


def test_interpolated_profiles_match_the_measured_ones(
    measured: dict[tuple[int, int, int, int], StageProfileResult],
) -> None:
    rows = []
    for a, b, devices, size in sorted(measured):
        if size != 2 or devices != 1:
            continue
        lo, mid, hi = (measured[(a, b, 1, s)] for s in SIZES)
        got = interpolate(lo, 1, hi, 4, 2)
        rows.append(
            {
                "stage": (a, b),
                **{
                    name: round(value(got) / value(mid) - 1.0, 4)
                    for name, value in (
                        ("flops", lambda r: r.flops),
                        ("stash", lambda r: r.intermediate_size),
                        ("peak", lambda r: r.peak_memory),
                        ("time", lambda r: r.compute_cost),
                    )
                },
            }
        )
        assert got.intermediate_size == pytest.approx(mid.intermediate_size, rel=1e-6, abs=8)
        assert lo.intermediate_size < got.intermediate_size < hi.intermediate_size
        assert got.initial_var_size == mid.initial_var_size == lo.initial_var_size
        # XLA's cost analysis counts a few fused ops differently per size: near, not exact
        assert got.flops == pytest.approx(mid.flops, rel=0.02), (a, b)
        assert lo.flops < got.flops < hi.flops
        assert got.peak_memory == pytest.approx(mid.peak_memory, rel=0.1), (a, b)
    assert len(rows) == 4  # embedding, block, head, embedding + block
    print("interpolated at micro-batch 2 / measured - 1:", rows)


def test_a_config_only_some_sizes_have_is_never_extrapolated(
    measured: dict[tuple[int, int, int, int], StageProfileResult],
) -> None:
    """Two-way data parallel exists at 2 and 4 only: 2 lies at an end of what has it, so it
    is measured there; a size between would come from 2 and 4 alone."""
    assert (0, 0, 2, 1) not in measured
    lo, hi = measured[(1, 1, 2, 2)], measured[(1, 1, 2, 4)]
    with pytest.raises(ValueError, match="not between"):
        interpolate(lo, 2, hi, 4, 2)
    got = interpolate(lo, 2, hi, 4, 3)
    assert lo.intermediate_size < got.intermediate_size < hi.intermediate_size
