"""Micro-batches searched at a fixed global batch, next to today's fixed count, in one run.

The 16-block GPT of bench/time_to_plan.py (zoo `gpt`, its widths, micro-batch 8) on 1 host x
4 virtual CPU devices, 1F1B, stages as written, data-parallel configs, on the same local Ray:
- fixed: today's default estimate search at B = 4 (global batch 32), the model traced at 8;
- auto: the model traced once with a symbolic batch dimension, then ONE job searching every
  count B in 4, 8, 16, 32 (micro-batches of 8, 4, 2, 1: `programs.spec_at_batch`) on one
  measuring pool, counts dropped once their optimistic best is slower than another count's
  measured plan (`workers.jobs.count_loop`), the fastest plan in simulated time answering,
  as `stageprof plan --micro-batches 4,8,16,32` does.

`--runs N` runs the pair N times (fixed, then auto, each in a fresh store) for the spread.
Printed side by side: each count's best plan (simulated ms, stages, stages measured at its
size), the chosen count, the fixed plan, and the time to plan of each (trace + job) with the
ratio. Never asserts a time: the machine is shared (load average printed); the last line is
one JSON object.

Usage: python bench/microbatch_search.py [--layers 16] [--counts 4,8,16,32] [--runs 1] [--quick]
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
    parser.add_argument("--runs", type=int, default=1, help="fixed/auto pairs (the spread)")
    parser.add_argument(
        "--per-count-jobs",
        action="store_true",
        help="also each run: one fixed job per count on a fresh store (the path before one "
        "job searched every count)",
    )
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
    search = options.model_copy(update={"microbatch_search": counts})
    runner = RunnerConfig(num_workers=args.workers)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="stageprof-mb-"))
    work.mkdir(parents=True, exist_ok=True)

    fixed_runs, auto_runs, fixed_traces, auto_traces = [], [], [], []
    per_count_s: list[dict[int, float]] = []  # --per-count-jobs: each count's job, seconds
    for run in range(args.runs):
        began = time.perf_counter()
        spec = zoo.build("gpt", num_layers=args.layers, remat_variants=(), **widths)
        fixed_traces.append(time.perf_counter() - began)
        fixed_runs.append(
            common.run_job(
                common.sqlite_sessions(work / f"fixed-{run}.db"), spec, cluster, options, runner
            )
        )
        began = time.perf_counter()
        symbolic = build_zoo_symbolic("gpt", num_layers=args.layers, remat_variants=(), **widths)
        auto_traces.append(time.perf_counter() - began)
        sessions = common.sqlite_sessions(work / f"auto-{run}.db")
        auto_runs.append(common.run_job(sessions, symbolic, cluster, search, runner))
        measured = _measured_by_size(sessions, auto_runs[-1].job_id)
        if args.per_count_jobs:
            per_count_s.append(
                _per_count_jobs(work / f"per-count-{run}.db", symbolic, cluster, search, runner)
            )
            common.console().print(f"run {run}: per-count jobs {per_count_s[-1]}", highlight=False)
        plan_ms = [
            None if r.outcome.plan is None else r.outcome.plan.predicted_iteration_time_s * 1e3
            for r in (fixed_runs[-1], auto_runs[-1])
        ]
        common.console().print(  # each pair as it ends (a long run can be read part way)
            f"run {run}: fixed {fixed_runs[-1].wall_seconds:.1f} s + {fixed_traces[-1]:.1f} s "
            f"trace ({plan_ms[0]} ms), auto {auto_runs[-1].wall_seconds:.1f} s + "
            f"{auto_traces[-1]:.1f} s trace ({plan_ms[1]} ms), measured {measured}",
            highlight=False,
        )
    fixed, auto = fixed_runs[-1], auto_runs[-1]
    plan = auto.outcome.plan
    assert plan is not None, auto.outcome.error
    batch = search.global_batch(symbolic.micro_batch_size)
    fixed_plan = fixed.outcome.plan
    fixed_s = [r.wall_seconds + t for r, t in zip(fixed_runs, fixed_traces, strict=True)]
    auto_s = [r.wall_seconds + t for r, t in zip(auto_runs, auto_traces, strict=True)]
    ratios = [a / f for a, f in zip(auto_s, fixed_s, strict=True)]
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
                "measured": measured.get(o.micro_batch_size, 0),
            }
            for o in plan.microbatch_options
        },
        "fixed_layout": stage_layout(fixed_plan.stages) if fixed_plan else None,
        "fixed_measured": fixed.outcome.stats.measured,
        "auto_measured": auto.outcome.stats.measured,
        "fixed_plan_s": [round(r.wall_seconds, 1) for r in fixed_runs],
        "fixed_trace_s": [round(t, 1) for t in fixed_traces],
        "auto_plan_s": [round(r.wall_seconds, 1) for r in auto_runs],
        "auto_trace_s": [round(t, 1) for t in auto_traces],
        "ratio_total": [round(r, 2) for r in ratios],
        "per_count_jobs_s": [
            {b: round(t, 1) for b, t in jobs.items()} | {"total": round(sum(jobs.values()), 1)}
            for jobs in per_count_s
        ],
        "load_avg": max(r.load_avg for r in [*fixed_runs, *auto_runs]),
    }
    rows = [
        (f"B={b}", f"{v['micro_batch']}", common.fmt(v["ms"]), str(v["measured"]), v["layout"])
        for b, v in out["per_count"].items()
    ]
    rows.append(
        (
            f"fixed B={args.fixed}",
            str(spec.micro_batch_size),
            common.fmt(out["fixed_ms"]),
            str(out["fixed_measured"]),
            out["fixed_layout"],
        )
    )
    table = common.side_by_side(
        f"micro-batches searched in one job (global batch {batch}); chosen "
        f"B={plan.num_microbatches}",
        rows,
        ("micro-batch", "simulated ms", "measured", "stages"),
    )
    common.console().print(table)
    common.console().print(
        f"time to plan (trace + job): auto {_spread(auto_s)} s vs fixed {_spread(fixed_s)} s: "
        f"{_spread(ratios, 2)}x (load average {out['load_avg']:.1f} on a shared machine)"
    )
    if per_count_s:
        jobs = [sum(x.values()) + t for x, t in zip(per_count_s, auto_traces, strict=True)]
        common.console().print(
            f"one job per count (before), trace + jobs: {_spread(jobs)} s: "
            f"{_spread([j / f for j, f in zip(jobs, fixed_s, strict=True)], 2)}x the fixed",
            highlight=False,
        )
    common.emit_json(out)
    return 0


def _measured_by_size(sessions: Any, job_id: str) -> dict[int, int]:
    """Distinct stages the job measured (or reused) at each micro-batch size."""
    from sqlalchemy import func, select

    from store import session_scope
    from store.tables import JobCandidateRow as C

    with session_scope(sessions) as s:
        rows = s.execute(
            select(C.micro_batch_size, func.count(func.distinct(C.fingerprint)))
            .where(C.job_id == job_id, C.profile_id.is_not(None))
            .group_by(C.micro_batch_size)
        )
        return {int(size): int(n) for size, n in rows}


def _per_count_jobs(
    db: Path, symbolic: Any, cluster: Any, search: Any, runner: Any
) -> dict[int, float]:
    """One fixed-count job per count of `search` on a fresh store (the spec stated at each
    count's size), as `stageprof plan --micro-batches` ran before: seconds per count."""
    from programs import spec_at_batch

    traced = symbolic.micro_batch_size
    sessions = common.sqlite_sessions(db)
    seconds = {}
    for b, size in search.count_sizes(traced):
        at_size = spec_at_batch(symbolic, size)
        run = common.run_job(sessions, at_size, cluster, search.at_count(b, traced), runner)
        seconds[b] = run.wall_seconds
    return seconds


def _spread(values: list[float], digits: int = 1) -> str:
    """One value, or `min-max (n runs)`."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{min(values):.{digits}f}-{max(values):.{digits}f} ({len(values)} runs)"


if __name__ == "__main__":
    raise SystemExit(main())
