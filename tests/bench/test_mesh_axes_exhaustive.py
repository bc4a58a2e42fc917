"""bench/mesh_axes_time_to_plan.py's exhaustive side with counts searched: one job per count,
each on the GPT traced at that count's micro-batch size, and their figures summed."""

import argparse

import mesh_axes_time_to_plan as bench  # bench/, on sys.path through tests/bench/conftest.py

from client.symbolic_batch import build_zoo_symbolic
from programs import spec_at_batch
from schemas import ClusterSpec, PlanOptions

WIDTHS = {"hidden_size": 32, "num_heads": 2, "seq_len": 16, "vocab_size": 128, "batch_size": 4}


def _args() -> argparse.Namespace:
    return bench.parse_args(["--small-layers", "1"])


def test_the_exhaustive_side_is_one_job_per_count_at_its_size() -> None:
    small = build_zoo_symbolic("gpt", num_layers=1, **WIDTHS)
    mesh = PlanOptions(
        num_microbatches=2, microbatch_search=[2, 4], global_batch_size=8, mesh_axes=["data"]
    )
    jobs = bench.exhaustive_jobs(_args(), small, mesh, WIDTHS)
    assert [name for name, _, _ in jobs] == ["small-exhaustive@2", "small-exhaustive@4"]
    for (_, spec, options), count in zip(jobs, (2, 4), strict=True):
        assert spec.micro_batch_size == 8 // count
        assert options.num_microbatches == count and options.microbatch_search is None
        assert options.search_mode == "exhaustive" and not options.prune
        stated = spec_at_batch(small, 8 // count)  # the symbolic GPT stated at that size
        assert [[v.shape for v in x.inputs] for x in spec.layers] == [
            [v.shape for v in x.inputs] for x in stated.layers
        ]
    fixed = PlanOptions(num_microbatches=2, mesh_axes=["data"])
    assert [n for n, _, _ in bench.exhaustive_jobs(_args(), small, fixed, WIDTHS)] == [
        "small-exhaustive"
    ]


def test_the_space_with_counts_is_every_count_s_candidates() -> None:
    spec = build_zoo_symbolic("gpt", num_layers=1, **WIDTHS)
    cluster = ClusterSpec(num_hosts=1, devices_per_host=2)
    counts = PlanOptions(
        num_microbatches=2, microbatch_search=[2, 8], global_batch_size=8, mesh_axes=["data"]
    )
    at_two = bench.space_size(spec_at_batch(spec, 4), cluster, counts.at_count(2, 4))
    at_eight = bench.space_size(spec_at_batch(spec, 1), cluster, counts.at_count(8, 4))
    # at micro-batch size 1 the data axis of 2 devices divides nothing: fewer candidates
    assert at_eight < at_two
    assert bench.space_size(spec, cluster, counts) == at_two + at_eight


def test_the_exhaustive_figures_are_summed_over_the_counts() -> None:
    def part(wall: float, ms: float | None, error: str | None = None) -> dict:
        return {
            "candidates": 10,
            "distinct_stages": 8,
            "measured": 10,
            "estimated": 0,
            "wall_s": wall,
            "load_avg": 1.0,
            "breakdown": {"compile_s": wall / 2, "timed_runs_s": 1.0},
            "predicted_iteration_ms": ms,
            "configs": [f"1:{ms}"],
            "plan": [[0, 2, 0, 0]] if ms else None,
            "error": error,
        }

    out = bench.summed(
        {"small-exhaustive@2": part(30.0, 5.0), "small-exhaustive@4": part(50.0, 4.0)}
    )
    assert out["wall_s"] == 80.0 and out["candidates"] == 20 and out["measured"] == 20
    assert out["breakdown"]["compile_s"] == 40.0 and out["breakdown"]["idle_s"] == 0.0
    assert out["predicted_iteration_ms"] == 4.0 and out["best_job"] == "small-exhaustive@4"
    assert out["plan"] == [[0, 2, 0, 0]] and not out["error"]
    failed = bench.summed({"a": part(1.0, None, "oom"), "b": part(2.0, 3.0)})
    assert failed["best_job"] == "b" and failed["error"] == "a: oom"
    one = part(7.0, 1.0)
    assert bench.summed({"small-exhaustive": one}) is one
