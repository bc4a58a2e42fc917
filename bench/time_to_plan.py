"""Time to plan: stageprof as built next to the exhaustive way, in one run.

A 16-block GPT (zoo `gpt`, small widths) on 1 host x 4 virtual CPU devices, B micro-batches,
planned twice on the same local Ray with the same number of actors, each on a fresh SQLite
store:
- ours: reuse by stage fingerprint (identical blocks measured once) + the estimate search
  (`PlanOptions.search = "estimate"`: layer profiles first, every stage estimated from them,
  exact measurements only for the stages of the plans that could be best);
- prune (`--only prune` or `all`): the search before estimates (`search = "prune"`: small
  stages first; a candidate that cannot beat the best measured plan is skipped);
- exhaustive: every (start, end, submesh, config) compiled and timed on its own, as Alpa does
  (`RunnerConfig(reuse_stages=False)`, `PlanOptions(prune=False)`).
The config space is `data_parallel_only` with the `data` strategy (one config per submesh,
343 candidates at 16 blocks), so the exhaustive run stays within minutes here.
Compiles are cold in both runs: ours gets an empty persistent compilation cache of its own
(`common.run_job`; a module compiled twice within the job may load the first, counted as
`cache_hits`), the exhaustive run none at all (`off`: every candidate compiled, as Alpa
does); neither reads the user's cache (bench/compile_cache.py measures what a warm one saves).

Printed: candidates, distinct stages, measured, compiles (measured x 3 modules), pruned,
wall time, the plans, whether they are the same (stage boundaries, submeshes, configs),
`plan_gap` (our plan's cost on the exhaustive run's table vs the exhaustive optimum; two runs
have independent timing noise) and the ratio; then where the time went (compile per module,
timed runs, store, the rest) from the stored results.

Usage: python bench/time_to_plan.py [--layers 16] [--micro-batches 8] [--workers 2] [--quick]
The last line printed is one JSON object with every figure.
"""

import argparse
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # bench/common.py (the script's directory is on sys.path)

CONFIG_SPACE = "data_parallel_only"
STRATEGIES = ["data"]
MODULES = ("forward", "backward", "apply_grad")
# Each run's compilation cache: ours an empty one of its own, the exhaustive run none.
CACHE = {"ours": None, "exhaustive": "off"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16, help="transformer blocks")
    parser.add_argument("--micro-batches", type=int, default=8, help="B")
    parser.add_argument("--workers", type=int, default=2, help="measuring actors per run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per module")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per module")
    parser.add_argument("--hosts", type=int, default=1)
    parser.add_argument("--devices-per-host", type=int, default=4)
    parser.add_argument(
        "--quick", action="store_true", help="tiny widths and 2 repeats (smoke tests)"
    )
    parser.add_argument(
        "--only",
        choices=["both", "ours", "exhaustive", "prune", "all"],
        default="both",
        help="runs to do: both = ours and exhaustive; prune = the search before estimates "
        "(every stage that could be in a better plan); all = the three",
    )
    parser.add_argument(
        "--exhaustive-from",
        help="a directory of an earlier `--only exhaustive --work-dir DIR` run (its "
        "exhaustive.db and the JSON line it printed, saved as DIR/run.log) to compare with "
        "instead of running it again (said in the JSON: exhaustive_from)",
    )
    parser.add_argument(
        "--ours-runs", type=int, default=1, help="cold runs of ours (do they plan the same?)"
    )
    parser.add_argument("--work-dir", help="where the SQLite files go (default: a temp dir)")
    parser.add_argument("--verbose", action="store_true", help="runner logs on stderr")
    return parser.parse_args(argv)


def measured_results(run: common.JobRun) -> list[Any]:
    """The distinct stages this job measured, one result each (at every micro-batch size)."""
    return list({r.fingerprint: r for r in run.profiles}.values())


def breakdown(run: common.JobRun, workers: int) -> dict[str, float]:
    """Where the actors' time went, from the distinct stages this job measured."""
    measured = measured_results(run)
    compile_s = dict.fromkeys(MODULES, 0.0)
    runs_s = 0.0
    for result in measured:
        for m in result.module_profile_results:
            compile_s[m.module.value] = compile_s.get(m.module.value, 0.0) + m.compile_seconds
            runs_s += sum(m.compute_cost_samples_s)
    actor_s = run.wall_seconds * workers
    compiled = sum(compile_s.values())
    out = {f"compile_{k}_s": round(v, 3) for k, v in compile_s.items()}
    out["compile_backward_per_stage_s"] = round(compile_s["backward"] / max(1, len(measured)), 3)
    out |= {
        "compile_s": round(compiled, 3),
        "timed_runs_s": round(runs_s, 3),
        # inside measure calls but neither: warm-up runs, composing, allocating, memory and
        # cost analysis, Ray transfer, and an actor's start-up before its first candidate
        "task_other_s": round(max(0.0, run.busy_seconds - compiled - runs_s), 3),
        # actors without a candidate: start-up, the driver storing results and pruning, the
        # tail when fewer candidates than actors are left
        "idle_s": round(max(0.0, actor_s - run.busy_seconds), 3),
        "store_s": round(run.store_seconds, 3),
        "actor_s": round(actor_s, 3),
    }
    return out


def summarize(run: common.JobRun, workers: int) -> dict[str, Any]:
    stats = run.outcome.stats
    plan = run.outcome.plan
    profiles = measured_results(run)
    return {
        "status": run.outcome.status.value,
        "error": run.outcome.error,
        "candidates": stats.candidates,
        "distinct_stages": stats.distinct_stages,
        "measured": stats.measured,
        # distinct stages recorded, at every micro-batch size (one per stage measured here)
        "profiles": len(profiles),
        "compiles": (stats.measured + stats.failed) * len(MODULES),
        "cache_hits": sum(r.compile_cache_hits for r in profiles),
        "pruned": stats.pruned,
        "estimated": stats.estimated,
        "failed": stats.failed,
        "wall_s": round(run.wall_seconds, 2),
        "load_avg": run.load_avg,
        "plan": common.plan_keys(plan) if plan else None,
        "plan_cost_s": plan.dp_cost_s if plan else None,
        "breakdown": breakdown(run, workers),
        # search: estimate only (layer profiles, verified full stages, estimate error)
        "search": plan.search.model_dump() if plan and plan.search else None,
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
    repeats = 2 if args.quick else args.repeats
    spec = zoo.build("gpt", num_layers=args.layers, **widths)
    cluster = ClusterSpec(num_hosts=args.hosts, devices_per_host=args.devices_per_host)
    base = dict(
        # 1F1B alone (no split backward measured) and the stages as written (no remat
        # variants among the candidates), as every run recorded in RESULTS.md
        schedule="1f1b",
        remat="as_written",
        # every layer in the pipeline: Alpa's space, the one every recorded run compared
        outside_layers=False,
        num_microbatches=args.micro_batches,
        config_space=CONFIG_SPACE,
        strategies=STRATEGIES,
        repeats=repeats,
        warmup=args.warmup,
        candidate_timeout_s=600,
    )
    setups = {
        "ours": (PlanOptions(**base, prune=True), RunnerConfig(num_workers=args.workers)),
        "prune": (
            PlanOptions(**base, search="prune"),
            RunnerConfig(num_workers=args.workers),
        ),
        "exhaustive": (
            PlanOptions(**base, prune=False),
            RunnerConfig(num_workers=args.workers, reuse_stages=False),
        ),
    }
    names = {
        "both": ["ours", "exhaustive"],
        "all": ["ours", "prune", "exhaustive"],
    }.get(args.only, [args.only])
    stored = None
    if args.exhaustive_from:
        names = [n for n in names if n != "exhaustive"]
        stored = load_exhaustive(Path(args.exhaustive_from))
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="stageprof-ttp-"))
    work.mkdir(parents=True, exist_ok=True)
    runs: dict[str, common.JobRun] = {}
    order = [(n, n) for n in names]
    if "ours" in names:
        order += [(f"ours.{k}", "ours") for k in range(2, args.ours_runs + 1)]
    for name, setup in order:
        options, runner_config = setups[setup]
        sessions = common.sqlite_sessions(work / f"{name}.db")
        began = time.perf_counter()
        runs[name] = common.run_job(
            sessions, spec, cluster, options, runner_config, cache_dir=CACHE[setup]
        )
        common.logger.warning("%s: %.1f s", name, time.perf_counter() - began)
    out = report(args, spec, runs, widths, repeats, stored)
    common.emit_json(out)
    return 0 if all(r.outcome.plan is not None for r in runs.values()) else 1


def report(
    args: argparse.Namespace,
    spec: Any,
    runs: dict[str, common.JobRun],
    widths: dict[str, int],
    repeats: int,
    stored: tuple[common.JobRun, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Print the side-by-side table and return the JSON figures (`stored`: an earlier
    exhaustive run and its figures, compared with instead of a run of this one)."""
    out: dict[str, Any] = {
        "model": "gpt",
        "blocks": args.layers,
        "layers": spec.num_layers,
        "widths": widths,
        "cluster": f"{args.hosts}x{args.devices_per_host} cpu (virtual devices)",
        "micro_batches": args.micro_batches,
        "config_space": CONFIG_SPACE,
        "strategies": STRATEGIES,
        "repeats": repeats,
        "warmup": args.warmup,
        "workers": args.workers,
        "commit": common.git_commit(),
    }
    figures = {name: summarize(run, args.workers) for name, run in runs.items()}
    if stored is not None:
        runs["exhaustive"] = stored[0]
        figures["exhaustive"] = stored[1]
        out["exhaustive_from"] = {
            "dir": args.exhaustive_from,
            "commit": stored[1].get("commit"),
            "load_avg": stored[1].get("load_avg"),
        }
    out |= figures
    ours_runs = [run for name, run in runs.items() if name.split(".")[0] == "ours"]
    if len(ours_runs) > 1:
        plans = [r.outcome.plan for r in ours_runs]
        keys = [common.plan_keys(p) if p else None for p in plans]
        out["ours_cold_runs"] = {
            "runs": len(ours_runs),
            "same_plan": all(k == keys[0] for k in keys),
            "plans": keys,
            "stability": [getattr(p, "stability", None) if p else None for p in plans],
            "runner_up_gap": [p.runner_up.gap if p and p.runner_up else None for p in plans],
            "cost_spread": [p.cost_spread if p else None for p in plans],
            "wall_s": [round(r.wall_seconds, 1) for r in ours_runs],
        }
    ours, exh = runs.get("ours"), runs.get("exhaustive")
    if ours and exh and ours.outcome.plan and exh.outcome.plan:
        our_keys = common.plan_keys(ours.outcome.plan)
        best = common.plan_cost(common.plan_keys(exh.outcome.plan), exh.results, args.micro_batches)
        ours_there = common.plan_cost(our_keys, exh.results, args.micro_batches)
        out["same_plan"] = our_keys == common.plan_keys(exh.outcome.plan)
        out["plan_gap"] = round((ours_there - best) / best, 4) if best > 0 else math.nan
        out["ratio"] = round(exh.wall_seconds / ours.wall_seconds, 2)
        out["exhaustive_same_stage_spread"] = same_stage_spread(exh, ours.fingerprints)
        out["plan_gap_on_medians"] = gap_on_medians(exh, ours, args.micro_batches)
    else:
        out["same_plan"] = None
        out["plan_gap"] = None
        out["ratio"] = None
    print_tables(out, figures)
    return out


def load_exhaustive(directory: Path) -> tuple[common.JobRun, dict[str, Any]]:
    """An earlier exhaustive run: its table from DIR/exhaustive.db, its figures from the
    JSON line it printed (DIR/run.log)."""
    import json
    from types import SimpleNamespace

    from sqlalchemy import select

    from store import job_plan, job_results, session_scope
    from store.tables import JobCandidateRow as C
    from store.tables import JobRow

    lines = (directory / "run.log").read_text().splitlines()
    printed = json.loads(next(x for x in reversed(lines) if x.startswith("{")))
    figures = printed["exhaustive"] | {"commit": printed.get("commit")}
    from store import make_engine, make_sessionmaker

    sessions = make_sessionmaker(make_engine(f"sqlite:///{directory / 'exhaustive.db'}"))
    with session_scope(sessions) as s:
        row = s.scalars(select(JobRow)).one()
        results = dict(job_results(s, job_id=row.id))
        keys = s.execute(select(C.start, C.end, C.submesh_id, C.config_id, C.fingerprint))
        fingerprints = {(a, b, m, c): fp for a, b, m, c, fp in keys}
        plan = job_plan(row)
        job_id = row.id
    outcome = SimpleNamespace(plan=plan, status=None, error=None, stats=None)
    run = common.JobRun(
        job_id,
        outcome,
        figures["wall_s"],
        results,
        0.0,
        busy_seconds=0.0,
        tasks=0,
        load_avg=figures.get("load_avg", 0.0),
        fingerprints=fingerprints,
        profiles=list(results.values()),
    )
    return run, figures


def gap_on_medians(exh: common.JobRun, ours: common.JobRun, micro: int) -> dict[str, Any]:
    """The plan gap on the exhaustive table with its noise averaged out: each candidate at
    the median of every measurement the exhaustive run made of its stage (identical blocks
    measured apart), the optimum of that table (Alpa's DP) against each of our runs' plans
    and the exhaustive run's own plan costed there."""
    import numpy as np

    from planner import training_dp

    groups: dict[str, list[float]] = {}
    for key, result in exh.results.items():
        if result.ok:
            groups.setdefault(ours.fingerprints.get(key, str(key)), []).append(result.compute_cost)
    table = {
        key: common.median(groups[ours.fingerprints.get(key, str(key))])
        for key, result in exh.results.items()
        if result.ok
    }
    plan = exh.outcome.plan
    num_layers = max(k[1] for k in table) + 1
    shape = (num_layers, num_layers, max(k[2] for k in table) + 1, max(k[3] for k in table) + 1)
    cost = np.full(shape, np.inf)
    for key, seconds in table.items():
        cost[key] = seconds
    by_id = {
        k[2]: (exh.results[k].submesh.hosts, exh.results[k].submesh.devices_per_host) for k in table
    }
    best = training_dp(
        cost, None, [by_id.get(m, (1, 1)) for m in range(shape[2])], plan.num_devices, micro
    )

    def alpa(keys: list[tuple[int, int, int, int]]) -> float:
        times = [table[k] for k in keys]
        return sum(times) + (micro - 1) * max(times)

    ours_cost = alpa(common.plan_keys(ours.outcome.plan))
    exh_cost = alpa(common.plan_keys(plan))
    return {
        "optimum_s": round(best.cost, 6),
        "ours_gap": round(ours_cost / best.cost - 1, 4),
        "exhaustive_plan_gap": round(exh_cost / best.cost - 1, 4),
    }


def same_stage_spread(exh: common.JobRun, fingerprints: dict) -> dict[str, Any]:
    """Timing noise inside the exhaustive table: candidates that are one stage (equal stage
    fingerprint: identical blocks) were measured separately there. Median over such pairs of
    |a - b| / ((a + b) / 2) of compute_cost, and the largest ratio max/min within a stage."""
    groups: dict[str, list[float]] = {}
    for key, result in exh.results.items():
        if result.ok and key in fingerprints:
            groups.setdefault(fingerprints[key], []).append(result.compute_cost)
    diffs, worst = [], 1.0
    for costs in groups.values():
        for i, a in enumerate(costs):
            diffs.extend(abs(a - b) / ((a + b) / 2) for b in costs[i + 1 :] if a + b > 0)
        if len(costs) > 1 and min(costs) > 0:
            worst = max(worst, max(costs) / min(costs))
    return {
        "stages_measured_more_than_once": sum(len(c) > 1 for c in groups.values()),
        "median_abs_rel_diff": round(common.median(diffs), 4) if diffs else None,
        "max_over_min": round(worst, 2),
    }


def print_tables(out: dict[str, Any], figures: dict[str, dict[str, Any]]) -> None:
    con = common.console()
    names = ("ours", "prune", "exhaustive")
    get = {n: figures.get(n, {}) for n in names}
    rows = [
        (label, get["ours"].get(k), get["prune"].get(k), get["exhaustive"].get(k))
        for label, k in (
            ("candidates", "candidates"),
            ("distinct stages", "distinct_stages"),
            ("measured", "measured"),
            ("compiles", "compiles"),
            ("compile cache hits", "cache_hits"),
            ("pruned", "pruned"),
            ("failed", "failed"),
            ("wall, s", "wall_s"),
            ("load average (mean)", "load_avg"),
            ("plan cost (own table), s", "plan_cost_s"),
        )
    ]
    for k in (
        "compile_forward_s",
        "compile_backward_s",
        "compile_apply_grad_s",
        "compile_backward_per_stage_s",
    ):
        rows.append((k, *(_bd(get[n], k) for n in names)))
    for k in ("timed_runs_s", "task_other_s", "idle_s", "store_s", "actor_s"):
        rows.append((k, *(_bd(get[n], k) for n in names)))
    for label, k in (
        ("layer profiles measured", "layer_profiles"),
        ("full stages measured (verified)", "verified"),
        ("stages estimated only", "estimated"),
        ("rounds", "rounds"),
        ("estimate error, median", "estimate_error_median"),
        ("estimate error, max", "estimate_error_max"),
        ("error band", "error_band"),
    ):
        rows.append((label, *((get[n].get("search") or {}).get(k) for n in names)))
    title = (
        f"time to plan: gpt {out['blocks']} blocks, {out['cluster']}, B={out['micro_batches']}, "
        f"{out['config_space']} {out['strategies']}"
    )
    con.print(common.side_by_side(title, rows, ("ours (estimate)", "prune", "exhaustive")))
    for name in names:
        if get[name].get("plan"):
            con.print(f"{name} plan (start, end, submesh, config): {get[name]['plan']}")
    con.print(
        f"same plan: {out['same_plan']}   plan gap: {out['plan_gap']}   ratio: {out['ratio']}"
    )
    if out.get("ours_cold_runs"):
        con.print(f"ours, cold runs: {out['ours_cold_runs']}")
    if out.get("exhaustive_same_stage_spread"):
        con.print(
            f"exhaustive run, one stage measured apart: {out['exhaustive_same_stage_spread']}"
        )


def _bd(fig: dict[str, Any], key: str) -> Any:
    return fig.get("breakdown", {}).get(key)


if __name__ == "__main__":
    raise SystemExit(main())
