"""Time to plan for MaxText: `stageprof plan --for maxtext` beside the default search, one run.

The 8-block GPT (zoo `gpt` at its default widths, as `stageprof plan --zoo gpt --set
num_layers=8`) on 1 host x 4 virtual CPU devices, B = 8 micro-batches, the `data` and
`megatron` strategies, every other option at the CLI's default (schedule auto, remat auto,
the estimate search), planned on the same local Ray, each run on a fresh SQLite store with an
empty compilation cache of its own:
- default: the unrestricted plan (`target` unset);
- maxtext: `target: maxtext`: the same search, which also verifies the best plan MaxText can
  run (uniform chunks of the blocks, GPipe or circular, embedding and head outside the
  pipeline on all devices);
- maxtext-exhaustive (`--with-exhaustive`): `target: maxtext` measuring every candidate, the
  way `--for maxtext` planned before it went through the estimate search.

Each setup runs `--repeat` times in ABBA order; the table shows each setup's fastest run,
and every run's wall time and load average is listed below it. Printed side by side: wall
time, candidates, measured / reused / estimated, the search's rounds, the unrestricted plan's
simulated time and schedule (and its layers outside the pipeline, if any), MaxText's best
(simulated: pipeline + outside) and its settings; then maxtext / default wall time. On a
shared machine wall times follow the load: compare runs of similar load average.

Usage: python bench/maxtext_time_to_plan.py [--layers 8] [--micro-batches 8] [--repeat 2]
       [--with-exhaustive]
The last line printed is one JSON object with every figure.
"""

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # bench/common.py (the script's directory is on sys.path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8, help="transformer blocks")
    parser.add_argument("--micro-batches", type=int, default=8, help="B")
    parser.add_argument("--hosts", type=int, default=1)
    parser.add_argument("--devices-per-host", type=int, default=4)
    parser.add_argument("--strategies", default="data,megatron")
    parser.add_argument("--workers", type=int, help="measuring groups at once (default: the CLI's)")
    parser.add_argument(
        "--with-exhaustive",
        action="store_true",
        help="also plan --for maxtext measuring every candidate (minutes more)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="cold runs of each setup, in ABBA order (default, maxtext, maxtext, default, "
        "...) so that a load change favours neither; the table shows each setup's fastest",
    )
    parser.add_argument("--quick", action="store_true", help="tiny widths (smoke tests)")
    parser.add_argument("--work-dir", help="where the SQLite files go (default: a temp dir)")
    parser.add_argument("--verbose", action="store_true", help="runner logs on stderr")
    return parser.parse_args(argv)


def summarize(run: common.JobRun) -> dict[str, Any]:
    """The figures of one run: cost, search and both plans."""
    stats = run.outcome.stats
    plan = run.outcome.plan
    out: dict[str, Any] = {
        "wall_s": round(run.wall_seconds, 1),
        "load_avg": round(run.load_avg, 2),
        "candidates": stats.candidates,
        "distinct_stages": stats.distinct_stages,
        "measured": stats.measured,
        "reused": stats.reused,
        "estimated": stats.estimated,
        "pruned": stats.pruned,
        "status": run.outcome.status.value,
        "error": run.outcome.error,
    }
    if plan is None:
        return out
    search = plan.search
    out |= {
        "search_mode": search.mode if search else "exhaustive",
        "rounds": search.rounds if search else None,
        "plan_s": plan.predicted_iteration_time_s,
        "plan_schedule": plan.schedule_name,
        "plan_outside": [st.layer_names[0] for st in plan.outside],
        "plan_layout": [
            (s.start, s.end, f"{s.submesh.hosts}x{s.submesh.devices_per_host}", s.config.label())
            for s in plan.stages
        ],
    }
    mt = plan.maxtext
    if mt is not None:
        out |= {
            "maxtext_feasible": mt.feasible,
            "maxtext_s": mt.predicted_iteration_time_s,
            "maxtext_pipeline_s": mt.pipeline_time_s,
            "maxtext_outside_s": mt.outside_time_s,
            "maxtext_schedule": mt.schedule,
            "maxtext_settings": mt.settings,
            "maxtext_reason": mt.reason,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_logging(args.verbose)
    from workers.cluster.ray_env import connect_ray

    connect_ray()  # before jax is imported: Ray forks its processes (as the CLI)

    from client import zoo
    from schemas import ClusterSpec, PlanOptions
    from workers.jobs.runner import RunnerConfig

    widths = common.QUICK_WIDTHS if args.quick else common.GPT_WIDTHS
    spec = zoo.build("gpt", num_layers=args.layers, **widths)
    cluster = ClusterSpec(num_hosts=args.hosts, devices_per_host=args.devices_per_host)
    base: dict[str, Any] = {
        "num_microbatches": args.micro_batches,
        "strategies": [s.strip() for s in args.strategies.split(",") if s.strip()],
    }
    setups = {
        "default": PlanOptions(**base),
        "maxtext": PlanOptions(**base, target="maxtext"),
    }
    if args.with_exhaustive:
        setups["maxtext-exhaustive"] = PlanOptions(**base, target="maxtext", search="exhaustive")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="stageprof-mttp-"))
    work.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in setups}
    for k in range(args.repeat):
        names = list(setups) if k % 2 == 0 else list(reversed(setups))
        for name in names:
            sessions = common.sqlite_sessions(work / f"{name}.{k}.db")
            began = time.perf_counter()
            run = common.run_job(
                sessions, spec, cluster, setups[name], RunnerConfig(num_workers=args.workers)
            )
            runs[name].append(summarize(run))
            common.logger.warning(
                "%s run %d: %.1f s, %s",
                name,
                k + 1,
                time.perf_counter() - began,
                common.json_text(runs[name][-1]),
            )
    rows = {name: min(r, key=lambda x: x["wall_s"]) for name, r in runs.items()}
    report(args, rows, runs)
    return 0 if all(x["status"] == "done" for r in runs.values() for x in r) else 1


def report(
    args: argparse.Namespace,
    rows: dict[str, dict[str, Any]],
    runs: dict[str, list[dict[str, Any]]],
) -> None:
    console = common.console()
    names = tuple(rows)
    fields = [
        ("wall s", "wall_s"),
        ("load avg", "load_avg"),
        ("search", "search_mode"),
        ("candidates", "candidates"),
        ("distinct stages", "distinct_stages"),
        ("measured", "measured"),
        ("estimated", "estimated"),
        ("pruned / skipped", "pruned"),
        ("rounds", "rounds"),
        ("unrestricted plan, ms", "plan_s"),
        ("its schedule", "plan_schedule"),
        ("  outside the pipeline", "plan_outside"),
        ("MaxText's best, ms", "maxtext_s"),
        ("  pipeline, ms", "maxtext_pipeline_s"),
        ("  outside, ms", "maxtext_outside_s"),
        ("  schedule", "maxtext_schedule"),
    ]
    ms = {"plan_s", "maxtext_s", "maxtext_pipeline_s", "maxtext_outside_s"}

    def cell(row: dict[str, Any], key: str) -> Any:
        value = row.get(key)
        if key in ms and isinstance(value, float):
            return f"{value * 1e3:.2f}"
        return value

    table = common.side_by_side(
        f"{args.layers}-block GPT on {args.hosts}x{args.devices_per_host}, "
        f"B = {args.micro_batches}, strategies {args.strategies}",
        [(label, *(cell(rows[n], key) for n in names)) for label, key in fields],
        names,
    )
    console.print(table)
    for name, row in rows.items():
        if row.get("maxtext_settings"):
            console.print(f"{name}: MaxText settings {row['maxtext_settings']}", highlight=False)
        console.print(f"{name}: unrestricted layout {row.get('plan_layout')}", highlight=False)
    for name, each in runs.items():
        walls = ", ".join(f"{x['wall_s']} s (load {x['load_avg']})" for x in each)
        console.print(f"{name} runs: {walls}", highlight=False)
    ratio = rows["maxtext"]["wall_s"] / rows["default"]["wall_s"]
    console.print(f"maxtext / default wall time (fastest runs): {ratio:.2f}x", highlight=False)
    common.emit_json(
        {
            "commit": common.git_commit(),
            "layers": args.layers,
            "micro_batches": args.micro_batches,
            "cluster": f"{args.hosts}x{args.devices_per_host}",
            "runs": rows,
            "every_run": runs,
            "maxtext_over_default": round(ratio, 3),
        }
    )


if __name__ == "__main__":
    import sys

    sys.exit(main())
