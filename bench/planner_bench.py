"""Benchmark the stage DP: our vectorised `training_dp` next to Alpa's loops.

Random tables like Alpa's test generator (tests/pipeline_parallel/test_dynamic_programming.py):
uniform costs in [0, 1) (entries with start > end set to inf: they are not stages),
`1 + divisors(devices)` configs per submesh, "power_of_two" submeshes, B = 16 micro-batches,
`max_n_succ_stages = 4096` ("alpa"); a memory-limited variant with random limits in [-1, 8)
("alpa_mem"); and a table shaped like real measurements ("scaled": cost = layer work /
devices^0.9 x noise, limits from a memory model, so big ranges on small submeshes do not
fit). The straightforward pure-Python loop implementation of the same
recurrence (`planner.reference.training_dp_loops`, Alpa's bound walk) runs only where its
estimated time is under the cap; elsewhere the estimate is shown.

Usage: python bench/planner_bench.py [--cap-seconds 60] [--repeats 3] [--quick]
The last line printed is one JSON object with every figure.
"""

import argparse
import json
import logging
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner import submesh_choices, training_dp  # noqa: E402
from planner.reference import ALPA_GAP, solve_bound_loops, training_dp_loops  # noqa: E402

logger = logging.getLogger("planner_bench")

LAYERS = (8, 16, 32, 64)
CLUSTERS = {8: (1, 8), 16: (2, 8), 64: (8, 8)}  # devices -> (hosts, devices per host)
MICROBATCHES = 16
GOALS_S = {(16, 16): 0.040, (64, 64): 2.0}


KINDS = ("alpa", "alpa_mem", "scaled")


def make_table(
    num_layers: int, num_devices: int, kind: str, seed: int = 42
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """A random table of the given kind (see the module docstring)."""
    hosts, per_host = CLUSTERS[num_devices]
    submeshes = submesh_choices(hosts, per_host, "power_of_two")
    configs = 1 + sum(1 for i in range(1, num_devices + 1) if num_devices % i == 0)
    rng = np.random.default_rng(seed)
    shape = (num_layers, num_layers, len(submeshes), configs)
    lower = np.tril(np.ones((num_layers, num_layers), dtype=bool), k=-1)
    if kind == "scaled":
        sizes = np.array([h * d for h, d in submeshes], dtype=float)[None, None, :, None]
        prefix = np.concatenate([[0.0], np.cumsum(rng.uniform(0.5, 1.5, num_layers))])
        work = np.abs(prefix[None, 1:] - prefix[:-1, None])[:, :, None, None]
        cost = work / sizes**0.9 * rng.uniform(1.0, 1.3, shape)
        memory = np.broadcast_to(np.maximum(work, 1e-3) / sizes, shape)
        capacity = 4.0 * prefix[-1] / num_devices  # a balanced 4-stage pipeline just fits
        mns = np.floor(capacity / memory - 1).astype(np.int64)
    else:
        cost = rng.random(shape)
        mns = rng.integers(-1, 8, shape) if kind == "alpa_mem" else np.full(shape, 4096)
    cost[lower] = np.inf
    return cost, mns, submeshes


def loop_iterations(num_layers: int, sizes: list[int], configs: int, devices: int) -> int:
    """Innermost iterations of Alpa's loops for one bound."""
    per_j = sum(sum(1 for n in sizes if n <= j) for j in range(1, devices + 1))
    return num_layers * (num_layers * (num_layers + 1) // 2) * per_j * configs


def alpa_bounds(cost: np.ndarray, optimum: float) -> int:
    """How many bounds Alpa's walk solves at least (its running best is >= the optimum)."""
    count, last = 0, 0.0
    for t in np.unique(cost[np.isfinite(cost)]).tolist():
        if t * MICROBATCHES >= optimum:
            break
        if t - last < ALPA_GAP:
            continue
        count, last = count + 1, t
    return count


def seconds_per_iteration() -> float:
    """Calibrate the loops: one bound of a small table."""
    cost, mns, submeshes = make_table(8, 8, "alpa")
    sizes = [h * d for h, d in submeshes]
    began = time.perf_counter()
    solve_bound_loops(cost.tolist(), mns.tolist(), sizes, 8, 1.0)
    return (time.perf_counter() - began) / loop_iterations(8, sizes, cost.shape[3], 8)


def run_case(num_layers: int, devices: int, kind: str, repeats: int, cap: float, rate: float):
    cost, mns, submeshes = make_table(num_layers, devices, kind)
    sizes = [h * d for h, d in submeshes]
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fast = training_dp(cost, mns, submeshes, devices, MICROBATCHES)
        times.append(time.perf_counter() - began)
    case = {
        "layers": num_layers,
        "devices": devices,
        "table": kind,
        "submeshes": len(submeshes),
        "configs": int(cost.shape[3]),
        "fast_s": statistics.median(times),
        "fast_cost": fast.cost,
        "fast_stages": len(fast.stages),
        "fast_bounds_solved": fast.num_bounds_solved,
    }
    logger.info("L=%d devices=%d %s: fast %.1f ms", num_layers, devices, kind, 1e3 * times[-1])
    if math.isfinite(fast.cost):
        bounds = alpa_bounds(cost, fast.cost)
    else:  # no plan: Alpa's walk never stops early
        bounds = int(np.unique(cost[np.isfinite(cost)]).size)
    iters = loop_iterations(num_layers, sizes, cost.shape[3], devices)
    estimate = 2 * rate * iters * max(bounds, 1)  # calibration runs ~2x optimistic
    case.update(loop_bounds_at_least=bounds, loop_estimate_s=estimate)
    if estimate > cap:
        case.update(loop_s=None, loop_cost=None, agree=None, loop_skipped=f"est. > {cap:g} s")
        return case
    began = time.perf_counter()
    slow = training_dp_loops(cost, mns, submeshes, devices, MICROBATCHES)
    elapsed = time.perf_counter() - began
    agree = (math.isinf(slow.cost) and math.isinf(fast.cost)) or math.isclose(
        slow.cost, fast.cost, rel_tol=1e-9
    )
    logger.info("L=%d devices=%d %s: loops %.1f s", num_layers, devices, kind, elapsed)
    case.update(
        loop_s=elapsed,
        loop_cost=slow.cost,
        loop_bounds_solved=slow.num_bounds_solved,
        agree=agree,
        loop_skipped=None,
        speedup=elapsed / case["fast_s"] if case["fast_s"] > 0 else None,
    )
    return case


def show(cases: list[dict]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is a dependency
        for c in cases:
            print(c)
        return
    table = Table(title=f"training_dp vs Alpa's loops, B = {MICROBATCHES}")
    for col in (
        "L",
        "devices",
        "table",
        "S x C",
        "fast ms",
        "bounds",
        "cost",
        "loops s",
        "loops bounds",
        "agree",
    ):
        table.add_column(col, justify="right")
    for c in cases:
        loops = (
            f"{c['loop_s']:.2f}"
            if c.get("loop_s") is not None
            else (f"skipped (~{c['loop_estimate_s']:.0f})")
        )
        table.add_row(
            str(c["layers"]),
            str(c["devices"]),
            c["table"],
            f"{c['submeshes']} x {c['configs']}",
            f"{1000 * c['fast_s']:.1f}",
            str(c["fast_bounds_solved"]),
            f"{c['fast_cost']:.6f}",
            loops,
            str(c.get("loop_bounds_solved", c["loop_bounds_at_least"])),
            {True: "yes", False: "NO", None: "-"}[c["agree"]],
        )
    Console(width=160).print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap-seconds", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="L <= 16 only")
    args = parser.parse_args()
    rate = seconds_per_iteration()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    cases = []
    for num_layers in LAYERS:
        if args.quick and num_layers > 16:
            continue
        for devices in CLUSTERS:
            for kind in KINDS:
                cases.append(
                    run_case(num_layers, devices, kind, args.repeats, args.cap_seconds, rate)
                )
    show(cases)
    goals = {}
    for (num_layers, devices), goal in GOALS_S.items():
        hit = [c for c in cases if (c["layers"], c["devices"]) == (num_layers, devices)]
        if hit:
            worst = max(c["fast_s"] for c in hit)
            goals[f"L{num_layers}_D{devices}"] = {
                "goal_s": goal,
                "worst_s": worst,
                "met": worst < goal,
            }
    summary = {
        "bench": "planner.training_dp",
        "microbatches": MICROBATCHES,
        "loop_seconds_per_iteration": rate,
        "loop_cap_s": args.cap_seconds,
        "all_agree": all(c["agree"] is not False for c in cases),
        "goals": goals,
        "cases": cases,
    }
    print(json.dumps(summary))
    return 0 if summary["all_agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
