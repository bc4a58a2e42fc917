"""Micro-batches searched at a fixed global batch, next to today's fixed count, in one run.

The 16-block GPT of bench/time_to_plan.py (zoo `gpt`, its widths, micro-batch 8) on 1 host x
4 virtual CPU devices, 1F1B, stages as written, data-parallel configs, on the same local Ray:
- fixed: today's default estimate search at B = 4 (global batch 32), the model traced at 8;
- auto: the model traced once with a symbolic batch dimension, then one estimate-search job
  per count B in 4, 8, 16, 32 (micro-batches of 8, 4, 2, 1: `programs.spec_at_batch`),
  the fastest plan in simulated time answering (`planner.microbatches.choose_count`), as
  `stageprof plan --micro-batches 4,8,16,32` does.

Printed side by side: each count's best plan (simulated ms, stages), the chosen count, the
fixed plan, and the time to plan of each (trace + jobs) with the ratio. Never asserts a time:
the machine is shared (load average printed); the last line is one JSON object.

Usage: python bench/microbatch_search.py [--layers 16] [--counts 4,8,16,32] [--quick]
"""

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # bench/common.py (the script's directory is on sys.path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16, help="transformer blocks")
    parser.add_argument("--counts", default="4,8,16,32", help="micro-batch counts searched")
    parser.add_argument("--fixed", type=int, default=4, help="today's count (sets the batch)")
    parser.add_argument("--workers", type=int, default=2, help="measuring actors")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per module")
    parser.add_argument("--devices-per-host", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="tiny widths, 2 repeats")
    parser.add_argument("--work-dir", help="where the SQLite files go (default: a temp dir)")
    parser.add_argument("--verbose", action="store_true", help="runner logs on stderr")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_logging(args.verbose)
    from workers.cluster.ray_env import connect_ray

    connect_ray(num_cpus=args.workers)  # before jax is imported: Ray forks its processes

    from client import zoo
    from client.symbolic_batch import build_zoo_symbolic
    from planner.microbatches import choose_count
    from programs import spec_at_batch
    from schemas import ClusterSpec, PlanOptions
    from schemas.plan import stage_layout
    from workers.jobs.runner import RunnerConfig

    widths = common.QUICK_WIDTHS if args.quick else common.GPT_WIDTHS
    cluster = ClusterSpec(num_hosts=1, devices_per_host=args.devices_per_host)
    counts = [int(x) for x in args.counts.split(",")]
    options = PlanOptions(
        schedule="1f1b",
        remat="as_written",
        num_microbatches=args.fixed,
        config_space="data_parallel_only",
        strategies=["data"],
        repeats=2 if args.quick else args.repeats,
        candidate_timeout_s=600,
    )
    runner = RunnerConfig(num_workers=args.workers)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="stageprof-mb-"))
    work.mkdir(parents=True, exist_ok=True)

    began = time.perf_counter()
    spec = zoo.build("gpt", num_layers=args.layers, remat_variants=(), **widths)
    fixed_trace = time.perf_counter() - began
    fixed = common.run_job(
        common.sqlite_sessions(work / "fixed.db"), spec, cluster, options, runner
    )

    began = time.perf_counter()
    symbolic = build_zoo_symbolic("gpt", num_layers=args.layers, remat_variants=(), **widths)
    traced = symbolic.micro_batch_size
    search = options.model_copy(update={"microbatch_search": counts})
    batch = search.global_batch(traced)
    specs = {b: spec_at_batch(symbolic, batch // b) for b in search.microbatch_counts(traced)}
    auto_trace = time.perf_counter() - began
    runs = {}
    sessions = common.sqlite_sessions(work / "auto.db")
    for b, at_size in specs.items():
        runs[b] = common.run_job(sessions, at_size, cluster, search.at_count(b, traced), runner)
    plans = {b: r.outcome.plan or str(r.outcome.error) for b, r in runs.items()}
    plan = choose_count(plans, batch)

    fixed_plan = fixed.outcome.plan
    auto_jobs = sum(r.wall_seconds for r in runs.values())
    out: dict[str, Any] = {
        "bench": "microbatch_search",
        "commit": common.git_commit(),
        "blocks": args.layers,
        "cluster": f"1x{args.devices_per_host}",
        "global_batch": batch,
        "counts": counts,
        "chosen_count": plan.num_microbatches,
        "chosen_micro_batch": plan.micro_batch_size,
        "auto_ms": plan.predicted_iteration_time_s * 1e3,
        "fixed_count": args.fixed,
        "fixed_ms": fixed_plan.predicted_iteration_time_s * 1e3 if fixed_plan else None,
        "per_count": {
            o.num_microbatches: {
                "micro_batch": o.micro_batch_size,
                "ms": None
                if o.predicted_iteration_time_s is None
                else o.predicted_iteration_time_s * 1e3,
                "layout": o.layout or o.reason,
                "plan_s": runs[o.num_microbatches].wall_seconds,
                "measured": len(runs[o.num_microbatches].results),
            }
            for o in plan.microbatch_options
        },
        "fixed_layout": stage_layout(fixed_plan.stages) if fixed_plan else None,
        "fixed_plan_s": fixed.wall_seconds,
        "fixed_trace_s": fixed_trace,
        "auto_plan_s": auto_jobs,
        "auto_trace_s": auto_trace,
        "ratio_jobs": auto_jobs / fixed.wall_seconds,
        "ratio_total": (auto_jobs + auto_trace) / (fixed.wall_seconds + fixed_trace),
        "load_avg": max([fixed.load_avg, *(r.load_avg for r in runs.values())]),
    }
    rows = [
        (f"B={b}", f"{v['micro_batch']}", common.fmt(v["ms"]), f"{v['plan_s']:.1f}", v["layout"])
        for b, v in out["per_count"].items()
    ]
    rows.append(
        (
            f"fixed B={args.fixed}",
            "8",
            common.fmt(out["fixed_ms"]),
            f"{fixed.wall_seconds:.1f}",
            out["fixed_layout"],
        )
    )
    table = common.side_by_side(
        f"micro-batches searched (global batch {batch}); chosen B={plan.num_microbatches}",
        rows,
        ("micro-batch", "simulated ms", "plan s", "stages"),
    )
    common.console().print(table)
    common.console().print(
        f"time to plan: auto {auto_jobs:.1f} s jobs + {auto_trace:.1f} s trace vs fixed "
        f"{fixed.wall_seconds:.1f} s + {fixed_trace:.1f} s: {out['ratio_total']:.2f}x "
        f"(load average {out['load_avg']:.1f} on a shared machine)"
    )
    common.emit_json(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
