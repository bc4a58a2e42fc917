"""Time to plan with the mesh-axes space searched, beside today's default search, one run.

Issue 38's target: planning with the mesh-axes space searched takes at most 2x the default
search's time on the same model, and stays at least 30x below measuring every candidate of
the bigger space. Runs, on one local Ray with the same actors, each on a fresh SQLite store:
- default: `bench/time_to_plan.py`'s "ours" (the 16-block GPT at its widths on 1 x 4 virtual
  CPU devices, B = 8, config space `data_parallel_only` with the `data` strategy, 1F1B, stages
  as written, every layer in the pipeline, the estimate search; an empty compilation cache);
- mesh: the same model and settings with the mesh-axes configs searched instead
  (`--mesh-axes`, default data,fsdp,tensor, under MaxText's rules; config space `all`;
  `--strategies` adds today's strategies, none by default);
- small-mesh and small-exhaustive: the mesh-axes space on a smaller GPT (`--small-layers`
  blocks, default 4) by the estimate search, and measuring every candidate the way
  `bench/time_to_plan.py`'s exhaustive side does (no reuse, no pruning, no compilation
  cache): the bigger space's exhaustive run does not finish here at 16 blocks. Its time per
  candidate times the 16-block candidate count is printed as an extrapolation, marked so.
  With counts searched, the bigger space is (partition x config x count): the exhaustive side
  is one job per count (the GPT traced at that count's micro-batch size, every candidate
  measured), and its figures are their sums (`small-exhaustive`; each count's in the JSON).

`--micro-batches` takes what `stageprof plan` takes (8, auto, 4,8,16,32): a search of counts
is passed to the mesh-axes jobs as `microbatch_search` at `--global-batch` (default: 8
micro-batches of the traced size) on the symbolic-batch GPT, while the default side plans the
one count that batch gives at the traced size (today's default; `--search-default-counts`
searches there too).

Usage: python bench/mesh_axes_time_to_plan.py [--layers 16] [--small-layers 4]
       [--mesh-axes data,fsdp,tensor] [--micro-batches 8] [--skip-exhaustive] [--quick]
The last line printed is one JSON object with every figure.
"""

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # bench/common.py (the script's directory is on sys.path)
import time_to_plan

# time_to_plan.py's settings for the default side (its "ours")
BASE: dict[str, Any] = dict(schedule="1f1b", remat="as_written", outside_layers=False)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16, help="transformer blocks")
    parser.add_argument(
        "--small-layers", type=int, default=4, help="blocks of the exhaustive side's GPT"
    )
    parser.add_argument("--mesh-axes", default="data,fsdp,tensor", help="axes searched")
    parser.add_argument("--strategies", default="", help="today's strategies beside them")
    parser.add_argument(
        "--micro-batches",
        default="8",
        help="a count, 'auto' or counts to search (4,8,16,32), as stageprof plan takes",
    )
    parser.add_argument("--global-batch", type=int, help="with a search of counts")
    parser.add_argument("--workers", type=int, default=2, help="measuring actors per run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per module")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per module")
    parser.add_argument("--skip-exhaustive", action="store_true", help="the two big runs only")
    parser.add_argument("--quick", action="store_true", help="tiny widths (smoke tests)")
    parser.add_argument(
        "--search-default-counts",
        action="store_true",
        help="with a search of counts, search them on the default side too (else it plans "
        "the one count global batch / traced micro-batch, as today's default does)",
    )
    parser.add_argument("--work-dir", help="where the SQLite files go (default: a temp dir)")
    parser.add_argument("--verbose", action="store_true", help="runner logs on stderr")
    return parser.parse_args(argv)


def count_options(args: argparse.Namespace, micro_batch_size: int) -> dict[str, Any]:
    """The micro-batch fields of every job's options (`--micro-batches`)."""
    from cli.commands.plan_counts import parse_micro_batches

    fields = parse_micro_batches(args.micro_batches)
    if "microbatch_search" in fields:
        fields["global_batch_size"] = args.global_batch or micro_batch_size * 8
    return fields


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_logging(args.verbose)
    from workers.cluster.ray_env import connect_ray

    connect_ray(num_cpus=args.workers)  # before jax is imported: Ray forks its processes

    from client import zoo
    from client.symbolic_batch import build_zoo_symbolic
    from schemas import ClusterSpec, PlanOptions
    from workers.jobs.runner import RunnerConfig

    widths = common.QUICK_WIDTHS if args.quick else common.GPT_WIDTHS
    repeats = 2 if args.quick else args.repeats
    searched = "," in args.micro_batches or args.micro_batches == "auto"
    build: Any = build_zoo_symbolic if searched else zoo.build
    big = build("gpt", num_layers=args.layers, **widths)
    small = build("gpt", num_layers=args.small_layers, **widths)
    cluster = ClusterSpec(num_hosts=1, devices_per_host=4)
    common_fields = BASE | count_options(args, big.micro_batch_size)
    common_fields |= dict(repeats=repeats, warmup=args.warmup, candidate_timeout_s=600)
    default_fields = dict(common_fields)
    if searched and not args.search_default_counts:  # today's default: one fixed count
        batch = default_fields.pop("global_batch_size")
        default_fields.pop("microbatch_search")
        default_fields["num_microbatches"] = batch // big.micro_batch_size
    default = PlanOptions(**default_fields, config_space="data_parallel_only", strategies=["data"])
    mesh = PlanOptions(
        **common_fields,
        strategies=[s for s in args.strategies.split(",") if s],
        mesh_axes=[a for a in args.mesh_axes.split(",") if a],
    )
    ours = RunnerConfig(num_workers=args.workers)
    setups: list[tuple[str, Any, Any, Any, str | None]] = [
        ("default", big, default, ours, None),
        ("mesh", big, mesh, ours, None),
    ]
    if not args.skip_exhaustive:
        every = RunnerConfig(num_workers=args.workers, reuse_stages=False)
        setups.append(("small-mesh", small, mesh, ours, None))
        setups += [
            (name, spec, options, every, "off")
            for name, spec, options in exhaustive_jobs(args, small, mesh, widths)
        ]
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="stageprof-mesh-ttp-"))
    work.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {}
    for name, spec, options, runner, cache in setups:
        began = time.perf_counter()
        run = common.run_job(
            common.sqlite_sessions(work / f"{name}.db"),
            spec,
            cluster,
            options,
            runner,
            cache_dir=cache,
        )
        common.logger.warning("%s: %.1f s", name, time.perf_counter() - began)
        figures[name] = time_to_plan.summarize(run, args.workers)
        plan = run.outcome.plan
        figures[name]["predicted_iteration_ms"] = (
            round(plan.predicted_iteration_time_s * 1e3, 3) if plan else None
        )
        figures[name]["configs"] = sorted(
            {f"{s.submesh.devices_per_host}:{s.config.label()}" for s in plan.stages}
            if plan
            else set()
        )
    if not args.skip_exhaustive:
        figures["small-exhaustive"] = summed(
            {k: v for k, v in figures.items() if k.startswith("small-exhaustive")}
        )
    out = report(args, big, small, cluster, mesh, figures, widths)
    common.emit_json(out)
    return 0 if all(f["plan"] is not None for f in figures.values()) else 1


def exhaustive_jobs(
    args: argparse.Namespace, small: Any, mesh: Any, widths: dict[str, int]
) -> list[tuple[str, Any, Any]]:
    """The exhaustive side's jobs (no pruning, every candidate measured): one on `small`
    with the mesh options; with counts searched, one per count, each on the GPT traced at
    that count's micro-batch size (the exhaustive search plans one count per job)."""
    from client import zoo

    exhaustive = mesh.model_copy(update={"prune": False, "search": "exhaustive"})
    if mesh.microbatch_search is None:
        return [("small-exhaustive", small, exhaustive)]
    traced = small.micro_batch_size
    jobs = []
    for count, size in mesh.count_sizes(traced):
        spec = zoo.build("gpt", num_layers=args.small_layers, **(widths | {"batch_size": size}))
        jobs.append((f"small-exhaustive@{count}", spec, exhaustive.at_count(count, traced)))
    return jobs


def summed(parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The exhaustive side's figures over its jobs (one per count): counts and times
    summed, the fastest count's plan."""
    if len(parts) == 1:
        return next(iter(parts.values()))
    out: dict[str, Any] = {"jobs": sorted(parts)}
    for key in ("candidates", "distinct_stages", "measured", "estimated", "wall_s"):
        out[key] = round(sum(p.get(key) or 0 for p in parts.values()), 2)
    out["breakdown"] = {
        key: round(sum(p.get("breakdown", {}).get(key) or 0.0 for p in parts.values()), 3)
        for key in ("compile_s", "timed_runs_s", "task_other_s", "idle_s")
    }
    loads = [p["load_avg"] for p in parts.values() if p.get("load_avg") is not None]
    out["load_avg"] = round(sum(loads) / len(loads), 2) if loads else None
    planned = {n: p for n, p in parts.items() if p.get("predicted_iteration_ms") is not None}
    best = min(planned, key=lambda n: planned[n]["predicted_iteration_ms"], default=None)
    out["predicted_iteration_ms"] = planned[best]["predicted_iteration_ms"] if best else None
    out["configs"] = planned[best]["configs"] if best else []
    out["best_job"] = best
    out["plan"] = planned[best]["plan"] if best else None
    out["error"] = "; ".join(f"{n}: {p['error']}" for n, p in parts.items() if p.get("error"))
    return out


def space_size(spec: Any, cluster: Any, options: Any) -> int:
    """The candidates measuring every one would measure: with counts searched, those of
    every count at its micro-batch size."""
    from planner import enumerate_candidates
    from programs import spec_at_batch

    if options.microbatch_search is None:
        return len(enumerate_candidates(spec, cluster, options).keys)
    traced = spec.micro_batch_size
    return sum(
        len(
            enumerate_candidates(
                spec_at_batch(spec, size), cluster, options.at_count(count, traced)
            ).keys
        )
        for count, size in options.count_sizes(traced)
    )


def report(
    args: argparse.Namespace,
    big: Any,
    small: Any,
    cluster: Any,
    mesh: Any,
    figures: dict[str, Any],
    widths: dict[str, int],
) -> dict[str, Any]:
    """The side-by-side table and the JSON figures: the mesh/default ratio (target at most
    2x) and exhaustive/ours on the small GPT (target at least 30x)."""
    out: dict[str, Any] = {
        "model": "gpt",
        "blocks": args.layers,
        "small_blocks": args.small_layers,
        "widths": widths,
        "cluster": "1x4 cpu (virtual devices)",
        "micro_batches": args.micro_batches,
        "mesh_axes": args.mesh_axes,
        "strategies_beside": args.strategies,
        "workers": args.workers,
        "commit": common.git_commit(),
    } | figures
    get = {name: figures.get(name, {}) for name in ("default", "mesh", "small-mesh")}
    exh = figures.get("small-exhaustive", {})

    def ratio(a: dict[str, Any], b: dict[str, Any]) -> float | None:
        return round(a["wall_s"] / b["wall_s"], 2) if a.get("wall_s") and b.get("wall_s") else None

    out["mesh_over_default"] = ratio(get["mesh"], get["default"])  # target: <= 2
    out["small_exhaustive_over_mesh"] = ratio(exh, get["small-mesh"])  # target: >= 30
    big_candidates = space_size(big, cluster, mesh)
    if exh.get("wall_s") and exh.get("candidates") and get["mesh"].get("wall_s"):
        per_candidate = exh["wall_s"] / exh["candidates"]
        out["exhaustive_extrapolated_s"] = round(per_candidate * big_candidates, 1)
        out["extrapolated_exhaustive_over_mesh"] = round(
            out["exhaustive_extrapolated_s"] / get["mesh"]["wall_s"], 1
        )
    out["mesh_candidates_big"] = big_candidates
    names = ("default", "mesh", "small-mesh", "small-exhaustive")
    rows = []
    for label, key in (
        ("candidates", "candidates"),
        ("distinct stages", "distinct_stages"),
        ("measured", "measured"),
        ("estimated", "estimated"),
        ("wall, s", "wall_s"),
        ("load average (mean)", "load_avg"),
        ("predicted iteration, ms", "predicted_iteration_ms"),
        ("plan's submesh:configs", "configs"),
    ):
        rows.append((label, *(figures.get(n, {}).get(key) for n in names)))
    for label, key in (
        ("layer profiles measured", "layer_profiles"),
        ("full stages measured (verified)", "verified"),
        ("rounds", "rounds"),
        ("estimate error, median", "estimate_error_median"),
    ):
        rows.append((label, *((figures.get(n, {}).get("search") or {}).get(key) for n in names)))
    for key in ("compile_s", "timed_runs_s", "task_other_s", "idle_s"):
        rows.append((key, *(figures.get(n, {}).get("breakdown", {}).get(key) for n in names)))
    con = common.console()
    title = (
        f"time to plan, mesh axes {args.mesh_axes}: gpt {args.layers} blocks (small: "
        f"{args.small_layers}), 1x4 cpu, micro-batches {args.micro_batches}"
    )
    con.print(common.side_by_side(title, rows, names))
    con.print(
        f"mesh / default: {out['mesh_over_default']}x (target <= 2)   small exhaustive / "
        f"small mesh: {out['small_exhaustive_over_mesh']}x (target >= 30)   "
        f"16-block exhaustive, extrapolated ({big_candidates} candidates): "
        f"{out.get('exhaustive_extrapolated_s')} s = "
        f"{out.get('extrapolated_exhaustive_over_mesh')}x the mesh run"
    )
    for name in names:
        if figures.get(name, {}).get("error"):
            con.print(f"{name}: {figures[name]['error']}")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
