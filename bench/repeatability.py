"""Repeatability: measure the same stage candidates twice and compare compute_cost.

A tiny GPT on 1 host x 8 virtual CPU devices with submeshes of 1, 2 and 4 devices (every
layer range on each; identical blocks measured once), measured by two jobs on fresh stores,
no pruning. For each submesh size: the same-stage difference, the median over stages of
|a - b| / ((a + b) / 2) where a and b are a stage's compute_cost (forward + backward) in the
two runs, its p90 and the largest max/min. Ours is the median of the timed runs (at least
`--repeats`, more until (p90 - p10) / median <= `--target-spread` or `--max-repeats`); next
to it, the same samples as Alpa reduces them (their mean) and a single timed run (the
first). Also per size: the recorded in-run spread (`compute_cost_spread`, median over
stages and runs) and the timed runs per module (median).

`--before` also measures the stages the way main did before quiet timing (no machine-wide
timing lock, exactly `--repeats` timed runs), two more runs in the same invocation, and
prints both methods side by side.

Usage: python bench/repeatability.py [--layers 4] [--repeats 5] [--max-repeats 40]
         [--target-spread 0.05] [--workers 2] [--before] [--quick]
The last line printed is one JSON object with every figure.
"""

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import common  # bench/common.py (the script's directory is on sys.path)

SUBMESHES = [(1, 1), (1, 2), (1, 4)]
REDUCTIONS = ("median", "mean", "first")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, help="transformer blocks (default 4; --quick 2)")
    parser.add_argument("--repeats", type=int, default=5, help="least timed runs per module")
    parser.add_argument("--max-repeats", type=int, help="most timed runs per module (40)")
    parser.add_argument("--target-spread", type=float, default=0.05, help="(p90-p10)/median")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per module")
    parser.add_argument("--workers", type=int, default=2, help="measuring actors")
    parser.add_argument("--quick", action="store_true", help="2 blocks, 3-6 repeats (smoke)")
    parser.add_argument(
        "--before", action="store_true", help="also measure the old way (no lock, fixed repeats)"
    )
    parser.add_argument("--work-dir", help="where the SQLite files go (default: a temp dir)")
    return parser.parse_args(argv)


def stage_time(result: Any, how: str) -> float:
    """forward + backward of a result, its samples reduced `how`."""
    total = 0.0
    for kind in ("forward", "backward"):
        module = next(m for m in result.module_profile_results if m.module.value == kind)
        samples = list(module.compute_cost_samples_s)
        if how == "median":
            total += module.compute_cost
        elif how == "mean":
            total += statistics.fmean(samples)
        else:
            total += samples[0]
    return total


def relative_differences(first: common.JobRun, second: common.JobRun) -> dict[int, dict]:
    """Per submesh size: |a - b| / mean(a, b) of every stage ok in both runs, per reduction;
    max/min of ours ("ratio"); the recorded in-run spreads ("spread") and timed runs per
    module ("runs") of both runs."""
    a = {r.fingerprint: r for r in first.results.values() if r.ok}
    b = {r.fingerprint: r for r in second.results.values() if r.ok}
    out: dict[int, dict[str, list[float]]] = {}
    for fp in sorted(a.keys() & b.keys()):
        size = a[fp].submesh.num_devices
        keys = (*REDUCTIONS, "ratio", "spread", "runs")
        per = out.setdefault(size, {k: [] for k in keys})
        for how in REDUCTIONS:
            x, y = stage_time(a[fp], how), stage_time(b[fp], how)
            per[how].append(abs(x - y) / ((x + y) / 2) if x + y > 0 else 0.0)
            if how == "median" and min(x, y) > 0:
                per["ratio"].append(max(x, y) / min(x, y))
        for result in (a[fp], b[fp]):
            per["spread"].append(result.compute_cost_spread)
            per["runs"].extend(
                len(m.compute_cost_samples_s)
                for m in result.module_profile_results
                if m.module.value in ("forward", "backward")
            )
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_logging()
    from workers.cluster.ray_env import connect_ray

    connect_ray(num_cpus=args.workers)  # before jax is imported: Ray forks its processes

    from client import zoo
    from schemas import ClusterSpec, PlanOptions
    from workers.jobs.runner import RunnerConfig

    layers = args.layers or (2 if args.quick else 4)
    repeats = 3 if args.quick else args.repeats
    max_repeats = args.max_repeats or (6 if args.quick else 40)
    spec = zoo.build("gpt", num_layers=layers, **common.QUICK_WIDTHS)
    cluster = ClusterSpec(num_hosts=1, devices_per_host=8)
    options = PlanOptions(
        schedule="1f1b",  # the stage numbers' repeatability: no split backward,
        remat="as_written",  # and no remat variants
        num_microbatches=4,
        submesh_space="manual",
        manual_submeshes=SUBMESHES,
        config_space="data_parallel_only",
        strategies=["data"],
        repeats=repeats,
        max_repeats=max(repeats, max_repeats),
        target_spread=args.target_spread,
        warmup=args.warmup,
        prune=False,
        candidate_timeout_s=600,
    )
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="stageprof-repeat-"))
    work.mkdir(parents=True, exist_ok=True)
    methods = {"ours": options}
    if args.before:
        methods["before"] = options.model_copy(update={"max_repeats": repeats})
    results = {}
    for method, opts in methods.items():
        os.environ["STAGEPROF_QUIET_TIMING"] = "0" if method == "before" else "1"
        runs = []
        for name in ("first", "second"):
            sessions = common.sqlite_sessions(work / f"{method}-{name}.db")
            config = RunnerConfig(num_workers=args.workers, devices_per_worker=4)
            runs.append(common.run_job(sessions, spec, cluster, opts, config))
        results[method] = (runs, relative_differences(*runs))
    out = report(args, layers, (repeats, options.max_repeats), results)
    common.emit_json(out)
    return 0


def _figures(diffs: dict[int, dict[str, list[float]]]) -> dict[str, dict[str, Any]]:
    return {
        str(size): {
            "stages": len(d["median"]),
            **{f"median_abs_rel_diff_{how}": round(common.median(d[how]), 4) for how in REDUCTIONS},
            "p90_abs_rel_diff_median": round(common.percentile(d["median"], 90), 4),
            "max_over_min": round(max(d["ratio"], default=1.0), 3),
            "median_in_run_spread": round(common.median(d["spread"]), 4),
            "median_timed_runs": common.median(d["runs"]),
        }
        for size, d in sorted(diffs.items())
    }


def report(
    args: argparse.Namespace,
    layers: int,
    repeats: tuple[int, int],
    results: dict[str, tuple[list[common.JobRun], dict[int, dict[str, list[float]]]]],
) -> dict[str, Any]:
    per_method = {method: _figures(diffs) for method, (_, diffs) in results.items()}
    from rich.table import Table

    least, most = repeats
    table = Table(
        title=f"repeatability: same-stage difference, median over stages of |a-b|/mean(a,b) of "
        f"compute_cost in two runs; gpt {layers} blocks; ours: quiet timing, {least}-{most} "
        f"timed runs per module (target spread {args.target_spread:g}); before: no lock, "
        f"{least} runs"
    )
    cols = ("method", "submesh", "stages", "median", "Alpa (mean)", "one run", "p90", "max/min")
    for col in (*cols, "in-run spread", "timed runs"):
        table.add_column(col, justify="left" if col in ("method", "submesh") else "right")
    for method, per_size in per_method.items():
        for size, fig in per_size.items():
            table.add_row(
                method,
                f"{size} device(s)",
                str(fig["stages"]),
                *(common.fmt(fig[f"median_abs_rel_diff_{how}"]) for how in REDUCTIONS),
                common.fmt(fig["p90_abs_rel_diff_median"]),
                common.fmt(fig["max_over_min"]),
                common.fmt(fig["median_in_run_spread"]),
                common.fmt(fig["median_timed_runs"]),
            )
    common.console().print(table)
    runs = results["ours"][0]
    out: dict[str, Any] = {
        "model": "gpt",
        "blocks": layers,
        "widths": common.QUICK_WIDTHS,
        "submeshes": SUBMESHES,
        "repeats": least,
        "max_repeats": most,
        "target_spread": args.target_spread,
        "warmup": args.warmup,
        "metric": "median over stages of |a - b| / ((a + b) / 2), compute_cost = fwd + bwd",
        "per_submesh_size": per_method["ours"],
        "wall_s": [round(r.wall_seconds, 1) for r in runs],
        "load_avg": [r.load_avg for r in runs],
        "commit": common.git_commit(),
    }
    if "before" in per_method:
        out["before"] = {
            "per_submesh_size": per_method["before"],
            "wall_s": [round(r.wall_seconds, 1) for r in results["before"][0]],
            "load_avg": [r.load_avg for r in results["before"][0]],
        }
    return out


if __name__ == "__main__":
    raise SystemExit(main())
