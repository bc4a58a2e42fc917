"""Timing clock: which clock and which lock discipline keep a module's time still under load.

One jitted program (a chain of matmul + tanh over a batch split on 2 virtual CPU devices,
~5-20 ms) is timed in `--trials` separate trials, each 1 warm-up + `--max-repeats` timed
runs, every run read on two clocks at once: wall (`time.perf_counter`) and process CPU time
(`time.process_time`, all XLA threads). Conditions, one after the other:
  idle               nothing else of ours runs (other users of the machine may);
  jax, no lock       a competitor process compiles fresh programs and times them, at will;
  jax, lock          the same, its compiles in `compile_slot` and runs in `timing_slot`;
                     each of our trials in `timing_slot` (workers/measure/quiet.py);
  busy, no lock      two processes spin on the two cores, outside any lock (as another
                     user's job would);
  busy, lock         the two spinners do their work in `compile_slot` chunks of 0.2 s.
Per condition, clock and estimator (median of the first `--repeats` runs, as today; min of
them; median of the adaptive prefix: runs added until (p90-p10)/median <= `--target-spread`
or `--max-repeats`, the rule of `workers.measure.timing.time_runs`, replayed on the recorded runs):
the estimate (median over trials), the ratio to idle, the same-stage difference (median
over trial pairs of |a - b| / mean(a, b): the figure of bench/time_to_plan.py and
bench/repeatability.py) and the trial-to-trial spread (p90-p10)/median.

Usage: python bench/timing_clock.py [--trials 12] [--repeats 5] [--max-repeats 40] [--quick]
The last line printed is one JSON object with every figure. Wall times are printed, never
asserted: the machine is shared.
"""

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import common  # bench/common.py (the script's directory is on sys.path)

CLOCKS = ("wall", "cpu")
ESTIMATORS = ("median", "min", "adaptive")
CONDITIONS = (
    ("idle", None, False),
    ("jax, no lock", "jax", False),
    ("jax, lock", "jax", True),
    ("busy, no lock", "busy", False),
    ("busy, lock", "busy", True),
)
READY_TIMEOUT_S = 120.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, help="trials per condition (12; quick 4)")
    parser.add_argument("--repeats", type=int, default=5, help="least timed runs")
    parser.add_argument("--max-repeats", type=int, help="timed runs per trial (40; quick 10)")
    parser.add_argument("--target-spread", type=float, default=0.05)
    parser.add_argument("--batch", type=int, default=512, help="rows of the program's input")
    parser.add_argument("--width", type=int, default=512, help="matmul size")
    parser.add_argument("--layers", type=int, default=4, help="matmul + tanh layers")
    parser.add_argument("--devices", type=int, default=2, help="virtual CPU devices")
    parser.add_argument(
        "--model", type=int, default=1, help="devices splitting the weights (collectives)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="passes over the conditions")
    parser.add_argument("--quick", action="store_true", help="few trials, small program")
    parser.add_argument("--role", default="measure", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def set_devices(devices: int) -> None:
    """Virtual CPU devices for this process (before jax is imported)."""
    flags = os.environ.get("XLA_FLAGS", "")
    flags = " ".join(f for f in flags.split() if "xla_force_host_platform_device_count" not in f)
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"


def build_program(args: argparse.Namespace) -> Any:
    """A jitted chain of matmul + tanh, the batch split over `devices / model` devices and
    each weight's columns over `model` (an all-gather between layers); returns a thunk."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    grid = np.asarray(jax.devices()[: args.devices]).reshape(-1, args.model)
    mesh = Mesh(grid, ("data", "model"))
    rng = np.random.default_rng(0)
    x = jax.device_put(
        rng.standard_normal((args.batch, args.width), np.float32),
        NamedSharding(mesh, PartitionSpec("data")),
    )
    ws = [
        jax.device_put(
            (rng.standard_normal((args.width, args.width)) / args.width**0.5).astype(np.float32),
            NamedSharding(mesh, PartitionSpec(None, "model")),
        )
        for _ in range(args.layers)
    ]

    @jax.jit
    def chain(x: Any, ws: list[Any]) -> Any:
        for w in ws:
            x = jnp.tanh(x @ w)
        return x

    return lambda: chain(x, ws)


def run_trial(run: Any, runs: int) -> dict[str, list[float]]:
    """One warm-up, then `runs` timed runs read on both clocks."""
    import jax

    jax.block_until_ready(run())
    out: dict[str, list[float]] = {c: [] for c in CLOCKS}
    for _ in range(runs):
        w0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(run())
        w1, c1 = time.perf_counter(), time.process_time()
        out["wall"].append(w1 - w0)
        out["cpu"].append(c1 - c0)
    return out


def adaptive_prefix(samples: list[float], repeats: int, cap: int, target: float) -> int:
    """How many runs `time_runs(..., max_repeats=cap, target_spread=target)` would take."""
    from workers.measure.timing import relative_spread

    n = repeats
    while n < min(cap, len(samples)) and relative_spread(samples[:n]) > target:
        n += 1
    return n


def estimates(samples: list[float], args: argparse.Namespace) -> dict[str, float]:
    """The estimators of one trial's runs on one clock (seconds), and the adaptive run count."""
    from workers.measure.timing import median

    first = samples[: args.repeats]
    n = adaptive_prefix(samples, args.repeats, args.max_repeats, args.target_spread)
    return {
        "median": median(first),
        "min": min(first),
        "adaptive": median(samples[:n]),
        "adaptive_runs": float(n),
    }


def pair_diff(values: list[float]) -> float:
    """Median over pairs of |a - b| / mean(a, b)."""
    diffs = [abs(a - b) / ((a + b) / 2) for a, b in itertools.combinations(values, 2) if a + b]
    return common.median(diffs)


def summarize(trials: list[dict[str, list[float]]], args: argparse.Namespace) -> dict[str, Any]:
    from workers.measure.timing import median, relative_spread

    out: dict[str, Any] = {}
    for clock in CLOCKS:
        per = [estimates(t[clock], args) for t in trials]
        fig: dict[str, Any] = {
            "within_trial_spread": round(
                median([relative_spread(t[clock][: args.repeats]) for t in trials]), 4
            ),
            "adaptive_runs": median([p["adaptive_runs"] for p in per]),
        }
        for est in ESTIMATORS:
            values = [p[est] for p in per]
            fig[est] = {
                "ms": round(1e3 * median(values), 3),
                "same_stage_diff": round(pair_diff(values), 4),
                "trial_spread": round(relative_spread(values), 4),
            }
        out[clock] = fig
    return out


def start_competitors(kind: str, lock: bool, lock_dir: str, devices: int) -> list[Any]:
    """Start the competing processes and wait until each has done its first piece of work."""
    env = dict(os.environ, STAGEPROF_QUIET_TIMING="1" if lock else "0", STAGEPROF_LOCK_DIR=lock_dir)
    count = 1 if kind == "jax" else 2
    procs = []
    for _ in range(count):
        cmd = [sys.executable, __file__, "--role", f"compete-{kind}", "--devices", str(devices)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    began = time.monotonic()
    for proc in procs:
        line = proc.stdout.readline() if proc.stdout else ""
        if line.strip() != "ready" or time.monotonic() - began > READY_TIMEOUT_S:
            stop(procs)
            raise RuntimeError(f"competitor {kind} did not start: {line!r}")
    return procs


def stop(procs: list[Any]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)


def compete_jax(args: argparse.Namespace) -> None:
    """Another actor: compile a fresh program (new shape), then time it, forever."""
    set_devices(args.devices)
    import jax
    import jax.numpy as jnp

    from workers.measure.quiet import compile_slot, timing_slot

    for i in itertools.count():
        size = 64 + (i % 512)

        def program(x: Any) -> Any:
            for k in range(24):
                x = jnp.tanh(x @ x.T + k) if k % 3 else jnp.sin(x) * 1.01
            return x

        x = jnp.ones((size, size), jnp.float32)
        with compile_slot():
            compiled = jax.jit(program).lower(x).compile()
        with timing_slot():
            for _ in range(5):
                jax.block_until_ready(compiled(x))
        if i == 0:
            print("ready", flush=True)


def compete_busy() -> None:
    """A CPU burner: 0.2 s chunks of spinning, each in a `compile_slot` (a no-op when off)."""
    from workers.measure.quiet import compile_slot

    print("ready", flush=True)
    while True:
        with compile_slot():
            end = time.perf_counter() + 0.2
            while time.perf_counter() < end:
                pass


def run_condition(
    run: Any, args: argparse.Namespace, kind: str | None, lock: bool, lock_dir: str, into: dict
) -> None:
    """`--trials` trials with the competitors of `kind` running, each in `timing_slot`."""
    from workers.measure.quiet import timing_slot

    procs = start_competitors(kind, lock, lock_dir, args.devices) if kind else []
    os.environ["STAGEPROF_QUIET_TIMING"] = "1" if lock else "0"
    os.environ["STAGEPROF_LOCK_DIR"] = lock_dir
    try:
        into["loads"].append(os.getloadavg()[0])
        began = time.perf_counter()
        for _ in range(args.trials):
            with timing_slot() as slot:
                into["trials"].append(run_trial(run, args.max_repeats))
            into["waits"].append(slot.waited_s)
            time.sleep(0.05)  # trials apart, as candidates are
        into["walls"].append(time.perf_counter() - began)
        into["loads"].append(os.getloadavg()[0])
    finally:
        stop(procs)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every condition's trials, the conditions run in turn `--rounds` times (pooled)."""
    set_devices(args.devices)
    run = build_program(args)
    lock_dir = tempfile.mkdtemp(prefix="stageprof-timing-clock-")
    pooled: dict[str, dict[str, list]] = {
        name: {"trials": [], "waits": [], "loads": [], "walls": []} for name, _, _ in CONDITIONS
    }
    for _ in range(args.rounds):
        for name, kind, lock in CONDITIONS:
            run_condition(run, args, kind, lock, lock_dir, pooled[name])
    results: dict[str, Any] = {}
    for (name, _, lock), got in zip(CONDITIONS, pooled.values(), strict=True):
        results[name] = summarize(got["trials"], args) | {
            "lock": lock,
            "load_avg": round(statistics.fmean(got["loads"]), 2),
            "wait_s_median": round(common.median(got["waits"]), 4),
            "wall_s": round(sum(got["walls"]), 2),
        }
    idle = results["idle"]
    for fig in results.values():
        for clock in CLOCKS:
            for est in ESTIMATORS:
                base = idle[clock][est]["ms"]
                fig[clock][est]["ratio_to_idle"] = round(fig[clock][est]["ms"] / base, 3)
    return results


def print_table(results: dict[str, Any], args: argparse.Namespace) -> None:
    from rich.table import Table

    table = Table(
        title=f"timing clock: matmul chain {args.batch}x{args.width}x{args.layers} on "
        f"{args.devices} virtual devices (model {args.model}), {args.rounds} x {args.trials} "
        "trials; same-stage diff = median |a-b|/mean over trial pairs"
    )
    cols = ("condition", "clock", "estimator", "ms", "x idle", "same-stage diff", "trial p90-p10")
    for col in (*cols, "runs/trial", "in-trial spread", "wait s", "load"):
        table.add_column(col, justify="left" if col in cols[:3] else "right")
    for name, fig in results.items():
        for clock in CLOCKS:
            for est in ESTIMATORS:
                e = fig[clock][est]
                table.add_row(
                    name,
                    clock,
                    est if est != "median" else f"median of {args.repeats}",
                    common.fmt(e["ms"]),
                    common.fmt(e["ratio_to_idle"]),
                    common.fmt(e["same_stage_diff"]),
                    common.fmt(e["trial_spread"]),
                    common.fmt(fig[clock]["adaptive_runs"]) if est == "adaptive" else "",
                    common.fmt(fig[clock]["within_trial_spread"]) if est == "median" else "",
                    common.fmt(fig["wait_s_median"]),
                    common.fmt(fig["load_avg"]),
                )
        table.add_section()
    common.console().print(table)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "compete-jax":
        compete_jax(args)
        return 0
    if args.role == "compete-busy":
        compete_busy()
        return 0
    common.setup_logging()
    if args.quick:
        args.trials = args.trials or 4
        args.max_repeats = args.max_repeats or 10
        args.batch, args.width, args.layers = 128, 256, 2
    args.trials = args.trials or 12
    args.max_repeats = args.max_repeats or 40
    results = measure(args)
    print_table(results, args)
    common.emit_json(
        {
            "program": {
                "batch": args.batch,
                "width": args.width,
                "layers": args.layers,
                "devices": args.devices,
                "model": args.model,
            },
            "trials": args.trials,
            "rounds": args.rounds,
            "repeats": args.repeats,
            "max_repeats": args.max_repeats,
            "target_spread": args.target_spread,
            "conditions": results,
            "cores": os.cpu_count(),
            "commit": common.git_commit(),
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
