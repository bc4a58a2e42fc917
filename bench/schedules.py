"""Schedules: each schedule's search on random tables, and the 16-block GPT planned per schedule.

Part 1 (search time, no measuring): random tables like `bench/planner_bench.py`'s "alpa"
kind (uniform costs in [0, 1), power-of-two submeshes, 3 configs each, no memory limit),
each stage's time split forward 1/3, backward 2/3, the backward into B and W at a random
share in [0.3, 0.7]. The 1F1B search (Alpa's DP, its runner-up and the re-ranking by
simulation) at L = 128 on 64 hosts x 8 devices; every schedule's search at L = 64 on 8 x 8.
Exactness (the same optimum as a brute force over every plan) is checked by
tests/planner/test_schedule_search.py on small tables.

Part 2 (`--gpt`): the 16-block GPT (zoo `gpt`) on 1 x 4 virtual CPU devices planned once with
`schedule: auto`: each schedule's best plan side by side (predicted iteration time, bubble,
peak memory, or why it has none) and which one `auto` picks. zb-h1 needs the backward
measured split into B and W; where the workers do not measure it, zb-h1 is reported as not
measured, never assumed.

Usage: python bench/schedules.py [--gpt] [--micro-batches 8] [--workers 2] [--quick]
The last line printed is one JSON object with every figure.
"""

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402  (bench/common.py)

from planner import CandidateSpace, submesh_choices  # noqa: E402
from planner.search import search_schedule  # noqa: E402
from planner.table import CostTable  # noqa: E402
from schemas import ShardingConfig, SubmeshShape  # noqa: E402

CONFIGS = 3
MICROBATCHES = 16
NAMES = ("1f1b", "gpipe", "zb-h1", "interleaved")


def random_table(num_layers: int, hosts: int, per_host: int, seed: int = 42) -> tuple:
    """A CostTable of random stage times (see the module docstring) and its candidate space."""
    shapes = submesh_choices(hosts, per_host, "power_of_two")
    rng = np.random.default_rng(seed)
    shape = (num_layers, num_layers, len(shapes), CONFIGS)
    cost = rng.random(shape)
    cost[np.tril(np.ones((num_layers, num_layers), dtype=bool), k=-1)] = np.inf
    share = rng.uniform(0.3, 0.7, shape)
    backward = cost * 2 / 3
    zeros, comm = np.zeros(shape), np.zeros(shape[:3])
    big = np.full(shape, 2.0**40)
    table = CostTable(
        forward=cost / 3,
        backward=backward,
        comm_forward=comm,
        comm_backward=comm,
        max_n_succ_stages=np.full(shape, 4096, dtype=np.int64),
        results={},
        statuses={},
        num_missing=0,
        input_grad=backward * share,
        weight_grad=backward * (1 - share),
        free_bytes=big,
        intermediate=zeros + 1.0,
        weight_stash=zeros + 1.0,
        fixed_bytes=zeros,
        available=big,
    )
    config = ShardingConfig(logical_mesh=(1, 1), strategy="data")
    space = CandidateSpace(
        submeshes=[SubmeshShape(hosts=h, devices_per_host=d) for h, d in shapes],
        configs=[[config] * CONFIGS for _ in shapes],
        keys=[],
    )
    return table, space


def time_search(name: str, num_layers: int, hosts: int, per_host: int) -> dict[str, Any]:
    table, space = random_table(num_layers, hosts, per_host)
    ranks = np.tile(np.arange(CONFIGS), (len(space.submeshes), 1))
    began = time.perf_counter()
    found = search_schedule(name, table, space, hosts * per_host, MICROBATCHES, ranks)
    seconds = time.perf_counter() - began
    best = found.best
    return {
        "schedule": name,
        "layers": num_layers,
        "cluster": f"{hosts}x{per_host}",
        "seconds": seconds,
        "stages": len(best.keys) if best else None,
        "virtual_stages": best.virtual_stages if best else None,
        "iteration_s": best.time if best else None,
        "proposals_simulated": len(found.ranked),
        "reason": found.reason,
    }


def search_part(quick: bool) -> list[dict[str, Any]]:
    cases = [("1f1b", 128, 64, 8)] + [(n, 64, 8, 8) for n in NAMES]
    if quick:
        cases = [("1f1b", 16, 2, 8)] + [(n, 16, 2, 4) for n in NAMES]
    return [time_search(*case) for case in cases]


def gpt_part(args: argparse.Namespace) -> dict[str, Any]:
    from workers.cluster.ray_env import connect_ray

    connect_ray(num_cpus=args.workers)  # before jax is imported: Ray forks its processes

    from client import zoo
    from schemas import ClusterSpec, PlanOptions
    from workers.jobs.runner import RunnerConfig

    widths = common.QUICK_WIDTHS if args.quick else common.GPT_WIDTHS
    spec = zoo.build("gpt", num_layers=args.layers, **widths)
    cluster = ClusterSpec(num_hosts=1, devices_per_host=4)
    options = PlanOptions(
        num_microbatches=args.micro_batches,
        config_space="data_parallel_only",
        strategies=["data"],
        repeats=2 if args.quick else 5,
        candidate_timeout_s=600,
        schedule="auto",
    )
    work = Path(tempfile.mkdtemp(prefix="stageprof-schedules-"))
    sessions = common.sqlite_sessions(work / "schedules.db")
    run = common.run_job(sessions, spec, cluster, options, RunnerConfig(num_workers=args.workers))
    plan = run.outcome.plan
    if plan is None:
        return {"error": "no plan", "wall_seconds": run.wall_seconds}
    rows = [o.model_dump() for o in plan.schedules]
    return {"chosen": plan.schedule_name, "schedules": rows, "wall_seconds": run.wall_seconds}


def _ms(value: Any) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value * 1e3:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpt", action="store_true", help="also plan the 16-block GPT")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke tests)")
    args = parser.parse_args(argv)
    common.setup_logging(False)
    console = common.console()
    figures: dict[str, Any] = {"search": search_part(args.quick)}
    console.print("search per schedule (random tables, B = 16, 3 configs per submesh)")
    for row in figures["search"]:
        console.print(
            f"  {row['schedule']:<12} L={row['layers']:<4} {row['cluster']:<5} "
            f"{row['seconds']:7.3f} s  stages {row['stages']}  v {row['virtual_stages']}  "
            f"simulated {row['iteration_s'] or 0:.4g} s  ({row['proposals_simulated']} "
            f"proposals simulated){'  ' + row['reason'] if row['reason'] else ''}"
        )
    if args.gpt:
        figures["gpt"] = gpt_part(args)
        gpt = figures["gpt"]
        console.print(f"{args.layers}-block GPT on 1x4, auto picks: {gpt.get('chosen')}")
        for o in gpt.get("schedules", []):
            peak = o["peak_memory"]
            console.print(
                f"  {o['schedule']:<12} v {o['virtual_stages']}  "
                f"{_ms(o['predicted_iteration_time_s'])} ms  bubble "
                f"{'-' if o['bubble_fraction'] is None else format(o['bubble_fraction'], '.1%')}"
                f"  peak {'-' if peak is None else f'{peak / 2**20:.1f} MiB'}  "
                f"{o['layout'] if o['feasible'] else o['reason']}"
            )
    common.emit_json(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
