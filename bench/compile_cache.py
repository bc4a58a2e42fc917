"""Compile cache: one job planned cold, then again with the persistent compilation cache warm.

The zoo GPT (small widths, `--layers` blocks) on 1 host x 4 virtual CPU devices planned twice
on the same local Ray, each on a fresh SQLite store (so the second job reuses no stored
profile and measures its stages again) with a fresh runner and fresh actors:
- cold: an empty compilation cache directory (`STAGEPROF_COMPILE_CACHE_DIR`);
- warm: the same directory, filled by the cold job's actors.
Side by side: wall seconds, stages measured, module compiles, the modules the cache served
(`compile_cache_hit`) and those of stages the cold job measured too (what the cache could
serve), and compile seconds per module kind (the sum of the stored results'
`compile_seconds` over the stages each job measured: lowering plus compiling, or plus
loading on a hit); the cache's files and bytes after each job; the plans. Timing noise
between the jobs can make them measure different stages (the search picks which from the
times it measured), so the counts are each job's own.

Usage: python bench/compile_cache.py [--layers 8] [--search prune] [--workers 2] [--quick]
The last line printed is one JSON object with every figure.
"""

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # bench/common.py (the script's directory is on sys.path)

MODULES = ("forward", "backward", "apply_grad")
RUNS = ("cold", "warm")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8, help="transformer blocks")
    parser.add_argument("--micro-batches", type=int, default=8, help="B")
    parser.add_argument("--workers", type=int, default=2, help="measuring actors per run")
    parser.add_argument(
        "--search", choices=["estimate", "prune", "exhaustive"], default="prune", help="search"
    )
    parser.add_argument("--hosts", type=int, default=1)
    parser.add_argument("--devices-per-host", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="tiny widths (smoke tests)")
    parser.add_argument("--work-dir", help="stores and the cache (default: a temp dir)")
    parser.add_argument("--verbose", action="store_true", help="runner logs on stderr")
    return parser.parse_args(argv)


def cache_size(path: Path) -> dict[str, int]:
    """Files and bytes in the cache directory."""
    files = [p for p in path.rglob("*") if p.is_file()] if path.exists() else []
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def measured_stages(run: common.JobRun) -> list[Any]:
    """The distinct stages a job measured, one result each."""
    return list({r.fingerprint: r for r in run.results.values()}.values())


def summarize(run: common.JobRun, cache: dict[str, int], before: set[str]) -> dict[str, Any]:
    """One job's figures, from the distinct stages it measured; `before`: the fingerprints
    of the stages the earlier job measured."""
    stats, plan = run.outcome.stats, run.outcome.plan
    measured = measured_stages(run)
    modules = [m for r in measured for m in r.module_profile_results]
    compile_s = dict.fromkeys(MODULES, 0.0)
    for m in modules:
        compile_s[m.module.value] = compile_s.get(m.module.value, 0.0) + m.compile_seconds
    return {
        "status": run.outcome.status.value,
        "error": run.outcome.error,
        "wall_s": round(run.wall_seconds, 2),
        "load_avg": run.load_avg,
        "candidates": stats.candidates,
        "measured": stats.measured,
        "modules": len(modules),
        "cache_hits": sum(m.compile_cache_hit for m in modules),
        # modules of stages the earlier job measured too (compiled into the cache there)
        "modules_measured_before": sum(
            len(r.module_profile_results) for r in measured if r.fingerprint in before
        ),
        "compile_s": round(sum(compile_s.values()), 3),
        **{f"compile_{k}_s": round(v, 3) for k, v in compile_s.items()},
        "compile_s_per_module": round(sum(compile_s.values()) / max(1, len(modules)), 3),
        "cache_files": cache["files"],
        "cache_mib": round(cache["bytes"] / 2**20, 2),
        "actors_started": stats.actors_started,
        "plan": common.plan_keys(plan) if plan else None,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_logging(args.verbose)
    from workers.cluster.ray_env import connect_ray

    connect_ray(num_cpus=args.workers)  # before jax is imported: Ray forks its processes

    from client import zoo
    from schemas import ClusterSpec, PlanOptions
    from workers.jobs.runner import RunnerConfig

    widths = common.QUICK_WIDTHS if args.quick else common.GPT_WIDTHS
    spec = zoo.build("gpt", num_layers=args.layers, **widths)
    cluster = ClusterSpec(num_hosts=args.hosts, devices_per_host=args.devices_per_host)
    options = PlanOptions(
        schedule="1f1b",
        remat="as_written",
        num_microbatches=args.micro_batches,
        config_space="data_parallel_only",
        strategies=["data"],
        repeats=2 if args.quick else 5,
        warmup=1,
        candidate_timeout_s=600,
        search=args.search,
    )
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="stageprof-cc-"))
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "xla"
    shutil.rmtree(cache, ignore_errors=True)
    uptime_before = os.getloadavg()
    figures: dict[str, dict[str, Any]] = {}
    before: set[str] = set()
    for name in RUNS:
        sessions = common.sqlite_sessions(work / f"{name}.db")
        began = time.perf_counter()
        run = common.run_job(
            sessions,
            spec,
            cluster,
            options,
            RunnerConfig(num_workers=args.workers),
            cache_dir=cache,
        )
        common.logger.warning("%s: %.1f s", name, time.perf_counter() - began)
        figures[name] = summarize(run, cache_size(cache), before)
        before = {r.fingerprint for r in measured_stages(run)}
    cold, warm = figures["cold"], figures["warm"]
    out: dict[str, Any] = {
        "model": "gpt",
        "blocks": args.layers,
        "layers": spec.num_layers,
        "widths": widths,
        "cluster": f"{args.hosts}x{args.devices_per_host} cpu (virtual devices)",
        "micro_batches": args.micro_batches,
        "search": args.search,
        "workers": args.workers,
        "commit": common.git_commit(),
        "loadavg_before": [round(x, 2) for x in uptime_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        **figures,
        "same_plan": cold["plan"] == warm["plan"],
        "wall_ratio": round(cold["wall_s"] / warm["wall_s"], 2) if warm["wall_s"] else None,
        "compile_ratio": round(cold["compile_s"] / warm["compile_s"], 2)
        if warm["compile_s"]
        else None,
    }
    print_table(out)
    common.emit_json(out)
    return 0 if cold["plan"] and warm["plan"] else 1


def print_table(out: dict[str, Any]) -> None:
    con = common.console()
    labels = [
        ("wall, s", "wall_s"),
        ("load average (mean)", "load_avg"),
        ("stages measured", "measured"),
        ("module compiles", "modules"),
        ("served by the cache", "cache_hits"),
        ("modules of stages measured cold too", "modules_measured_before"),
        ("compile s, all modules", "compile_s"),
        ("compile s, forward", "compile_forward_s"),
        ("compile s, backward", "compile_backward_s"),
        ("compile s, apply_grad", "compile_apply_grad_s"),
        ("compile s per module", "compile_s_per_module"),
        ("cache files after", "cache_files"),
        ("cache MiB after", "cache_mib"),
        ("actors started", "actors_started"),
    ]
    rows = [(label, out["cold"].get(k), out["warm"].get(k)) for label, k in labels]
    title = (
        f"compile cache: gpt {out['blocks']} blocks, {out['cluster']}, "
        f"B={out['micro_batches']}, search {out['search']}, {out['workers']} actors"
    )
    con.print(common.side_by_side(title, rows, RUNS))
    for name in RUNS:
        con.print(f"{name} plan (start, end, submesh, config): {out[name]['plan']}")
    con.print(
        f"same plan: {out['same_plan']}   wall ratio: {out['wall_ratio']}   "
        f"compile ratio: {out['compile_ratio']}   load before/after: "
        f"{out['loadavg_before']} / {out['loadavg_after']}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
