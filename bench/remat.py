"""Remat chosen by the planner: what the variants cost in the spec, and plans under memory.

Part 1 (tracing): the GPT (hidden 256, 8 blocks) traced with and without remat variants:
spec size, trace time, and per block the stash and backward FLOPs of each variant.

Part 2 (`--plan`, measuring on 1 x 4 virtual CPU devices, 1F1B, data-parallel configs, each
job in a fresh store):
1. ample memory, `remat: as_written`: the stages measured today, and the best plan;
2. ample memory, `remat: auto`: how many stages it measures (the variants are only measured
   where the as-written stage lacks room) and what it picks;
3. device memory set just under the least that any as-written plan needs (found from job 1's
   measurements), `remat: as_written` gives no plan; `remat: auto` is measured and planned;
4. the same memory, `remat: full` (every stage fully rematerialized).

Usage: python bench/remat.py [--plan] [--quick] [--workers 2]
The last line printed is one JSON object with every figure.
"""

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402  (bench/common.py)

WIDTHS = {"hidden_size": 256, "num_heads": 4, "seq_len": 64, "vocab_size": 512, "batch_size": 8}
MICRO = 8


def trace_part(widths: dict[str, int], blocks: int) -> dict[str, Any]:
    from client import zoo

    out: dict[str, Any] = {}
    specs = {}
    for label, variants in (("as_written only", ()), ("with full, dots", ("full", "dots"))):
        began = time.perf_counter()
        spec = zoo.build("gpt", num_layers=blocks, remat_variants=variants, **widths)
        out[label] = {
            "trace_s": time.perf_counter() - began,
            "spec_mib": len(spec.model_dump_json()) / 2**20,
            "program_mib": sum(layer.program_chars for layer in spec.layers) / 2**20,
        }
        specs[label] = spec
    block = specs["with full, dots"].layers[1]
    per_variant = {}
    for name in ("as_written", *block.remat_variants):
        form = block.variant(name)
        own = {v.name: v for v in [*form.inputs, *form.outputs]}
        stash = sum(r.size_bytes for r in form.residuals) + sum(
            own[n].size_bytes for n in form.saved
        )
        per_variant[name] = {
            "stash_kib": stash / 1024,
            "backward_mflops": form.backward_flops / 1e6,
        }
    out["block"] = per_variant
    out["forward_mflops"] = block.flops / 1e6
    return out


def _cluster(memory: int | None) -> Any:
    from schemas import ClusterSpec

    if memory is None:
        return ClusterSpec(num_hosts=1, devices_per_host=4)
    return ClusterSpec(num_hosts=1, devices_per_host=4, device_memory_bytes=memory)


def _options(remat: str, quick: bool) -> Any:
    from schemas import PlanOptions

    return PlanOptions(
        num_microbatches=MICRO,
        config_space="data_parallel_only",
        strategies=["data"],
        repeats=2 if quick else 3,
        candidate_timeout_s=600,
        schedule="1f1b",
        remat=remat,
    )


def _job(spec: Any, memory: int | None, remat: str, args: argparse.Namespace) -> Any:
    from workers.jobs.runner import RunnerConfig

    work = Path(tempfile.mkdtemp(prefix="stageprof-remat-"))
    sessions = common.sqlite_sessions(work / "remat.db")
    config = RunnerConfig(num_workers=args.workers)
    return common.run_job(sessions, spec, _cluster(memory), _options(remat, args.quick), config)


def least_memory(spec: Any, results: dict, quick: bool) -> int:
    """The least device memory under which some as-written plan fits, from measured results
    (each result's memory rule recomputed for the memory tried): bisection."""
    from planner import NoFeasiblePlan, build_plan, enumerate_candidates
    from schemas.profile import max_n_succ_stages

    options = _options("as_written", quick)

    def fits(memory: int) -> bool:
        cluster = _cluster(memory)
        space = enumerate_candidates(spec, cluster, options)
        moved = {}
        for key, r in results.items():
            if not r.ok:
                continue
            n = max_n_succ_stages(memory, r.peak_memory, r.initial_var_size, r.intermediate_size)
            moved[key] = r.model_copy(update={"available_memory": memory, "max_n_succ_stages": n})
        try:
            build_plan(spec, cluster, options, space, moved)
        except NoFeasiblePlan:
            return False
        return True

    lo, hi = 2**20, 2**34
    while hi - lo > 2**16:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def _summary(run: Any) -> dict[str, Any]:
    plan = run.outcome.plan
    out: dict[str, Any] = {"measured": run.tasks, "wall_s": run.wall_seconds}
    if plan is None:
        out["plan"] = None
        out["error"] = run.outcome.error
        return out
    out["iteration_ms"] = plan.predicted_iteration_time_s * 1e3
    out["stages"] = [
        f"{s.start}-{s.end} {s.submesh.hosts}x{s.submesh.devices_per_host} {s.remat}"
        for s in plan.stages
    ]
    return out


def plan_part(args: argparse.Namespace) -> dict[str, Any]:
    from client import zoo

    widths = common.QUICK_WIDTHS if args.quick else WIDTHS
    spec = zoo.build("gpt", num_layers=args.blocks, **widths)
    out: dict[str, Any] = {}
    written = _job(spec, None, "as_written", args)
    out["ample, as_written"] = _summary(written)
    out["ample, auto"] = _summary(_job(spec, None, "auto", args))
    memory = least_memory(spec, written.results, args.quick) - 2**16
    out["tight_memory_mib"] = memory / 2**20
    out["tight, auto"] = _summary(_job(spec, memory, "auto", args))
    out["tight, full"] = _summary(_job(spec, memory, "full", args))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", action="store_true", help="also measure and plan (minutes)")
    parser.add_argument("--quick", action="store_true", help="a tiny GPT (smoke test)")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    common.setup_logging(False)
    if args.plan:
        from workers.cluster.ray_env import connect_ray

        connect_ray(num_cpus=args.workers)  # before jax is imported: Ray forks its processes
    widths = common.QUICK_WIDTHS if args.quick else WIDTHS
    figures: dict[str, Any] = {"trace": trace_part(widths, args.blocks)}
    t = figures["trace"]
    print(f"GPT {widths['hidden_size']} hidden, {args.blocks} blocks: spec size and trace time")
    for label in ("as_written only", "with full, dots"):
        row = t[label]
        print(
            f"  {label:16s} spec {row['spec_mib']:7.2f} MiB (programs {row['program_mib']:.2f})"
            f"  trace {row['trace_s']:.1f} s"
        )
    print(f"  one block: forward {t['forward_mflops']:.1f} MFLOP")
    for name, row in t["block"].items():
        print(
            f"    {name:10s} stash {row['stash_kib']:9.1f} KiB  backward "
            f"{row['backward_mflops']:.1f} MFLOP"
        )
    if args.plan:
        figures["plan"] = plan_part(args)
        p = figures["plan"]
        print(
            f"\nPlans on 1x4 devices, 1F1B, B = {MICRO} "
            f"(tight memory {p['tight_memory_mib']:.1f} MiB)"
        )
        for label in ("ample, as_written", "ample, auto", "tight, auto", "tight, full"):
            row = p[label]
            time_ms = row.get("iteration_ms")
            shown = (
                "no plan" if time_ms is None or not math.isfinite(time_ms) else f"{time_ms:.2f} ms"
            )
            print(f"  {label:18s} measured {row['measured']:4d}  {shown:>10s}  {row.get('stages')}")
    common.emit_json(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
