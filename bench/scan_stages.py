"""Stages of k identical blocks compiled unrolled vs as one `lax.scan` (issue 29, item 3).

The zoo GPT (`common.GPT_WIDTHS`, hidden 64), stages of 2, 4, 8 and 16 blocks (layers
block0..), one CPU device, data strategy, adam. Each stage is built as the workers build it
(`workers.measure`: `compose_stage` + `StageModules` unrolled, `scan_stage_modules` scanned);
its forward, backward and apply_grad are compiled (seconds per module; apart, the one-layer
compiles that count the scan's uncounted iterations' FLOPs: cached, the first stage pays
them). Forward and backward are then timed with the workers' timing code (`time_runs` of
`workers.measure.timing`, the workers' clock), the two compositions alternating, `--rounds`
rounds of `--repeats` runs each, so that both see the same machine load. Printed side by
side: compile seconds, median and spread ((p90 - p10) / median) of the forward and backward
times, FLOPs (cost analysis, plus the loop's uncounted iterations), stash (intermediate_size)
and peak memory; and whether the medians agree within the larger of the two spreads (the
condition to make the scan the workers' default).

Usage: python bench/scan_stages.py [--blocks 2 4 8 16] [--rounds 4] [--repeats 10] [--quick]
The last line printed is one JSON object with every figure.
"""

import argparse
import os
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import common  # bench/common.py (the script's directory is on sys.path)


def _build(spec: Any, end: int, scanned: bool) -> dict[str, Any]:
    """Compile the stage of layers 1..end; its modules, arrays and static figures."""
    import jax

    from schemas import ShardingConfig
    from workers.measure.compose import compose_stage
    from workers.measure.scan_modules import scan_stage_modules
    from workers.measure.sharding import make_mesh, stage_shardings
    from workers.measure.stage_modules import StageModules
    from workers.measure.timing import random_array

    config = ShardingConfig(logical_mesh=(1, 1), strategy="data")
    mesh = make_mesh(jax.devices()[:1], config)
    program = compose_stage(spec, 1, end)
    shardings = stage_shardings(mesh, config, program.params, program.inputs)
    modules: Any = StageModules(program, shardings, "adam")
    if scanned:
        modules = scan_stage_modules(spec, 1, end, config, shardings, "adam")
        if modules is None:
            raise RuntimeError(f"layers 1..{end} have no run of identical layers")
    compiled = {
        "forward": modules.compile_forward(),
        "backward": modules.compile_backward(),
        "apply_grad": modules.compile_apply_grad(),
    }
    loop_s: dict[str, float] = getattr(modules, "loop_flops_seconds", {})
    params = [random_array(s, i) for i, s in enumerate(shardings_structs(program, shardings))]
    if scanned:
        params = [
            jax.device_put(v, s.sharding)
            for v, s in zip(modules.program.stack(params), modules.param_structs, strict=True)
        ]
    inputs = [random_array(s, 1000 + i) for i, s in enumerate(modules.input_structs)]
    fwd, bwd = compiled["forward"], compiled["backward"]
    outs, stash, _ = jax.block_until_ready(fwd.compiled(params, inputs))
    cot = tuple(jax.numpy.ones_like(o) for o in outs)
    flops = {
        k: max(0.0, float((m.compiled.cost_analysis() or {}).get("flops", 0.0))) + m.flops_uncounted
        for k, m in compiled.items()
    }
    return {
        "runs": {
            "forward": lambda: fwd.compiled(params, inputs),
            "backward": lambda: bwd.compiled(params, stash, cot),
        },
        # the modules' own compiles, and apart the one-layer compiles that count the scan's
        # uncounted iterations' FLOPs (once per block and sharding in a process)
        "compile_s": {k: m.compile_seconds - loop_s.get(k, 0.0) for k, m in compiled.items()},
        "layer_flops_compile_s": sum(loop_s.values()),
        "mflop": {k: v / 1e6 for k, v in flops.items()},
        "intermediate_size": sum(modules.stash_sizes),
        "peak_bytes": {k: m.memory.peak for k, m in compiled.items() if k != "apply_grad"},
        "num_params": len(modules.param_structs),
    }


def shardings_structs(program: Any, shardings: Any) -> list[Any]:
    """The unrolled stage's parameters as sharded ShapeDtypeStructs."""
    import jax

    return [
        jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=s)
        for p, s in zip(program.params, shardings.params, strict=True)
    ]


def _time(stages: dict[str, dict[str, Any]], rounds: int, repeats: int) -> dict[str, Any]:
    """Samples (s) per composition and module: rounds alternate which composition goes first."""
    import jax

    from workers.measure.timing import Deadline, clock_for, time_runs

    clock = clock_for(jax.devices()[:1])
    samples: dict[str, dict[str, list[float]]] = {
        name: {"forward": [], "backward": []} for name in stages
    }
    names = list(stages)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            for module, run in stages[name]["runs"].items():
                got, _ = time_runs(run, 1, repeats, Deadline(float("inf")), module, clock=clock)
                samples[name][module] += got
    return samples


def _summary(samples: list[float]) -> dict[str, float]:
    from workers.measure.timing import median, relative_spread

    return {"median_ms": median(samples) * 1e3, "spread": relative_spread(samples)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per round")
    parser.add_argument("--quick", action="store_true", help="tiny widths, 2 and 3 blocks")
    args = parser.parse_args()
    common.setup_logging()
    from client import zoo

    widths = common.QUICK_WIDTHS if args.quick else common.GPT_WIDTHS
    blocks = [2, 3] if args.quick else args.blocks
    spec = zoo.build("gpt", num_layers=max(blocks), **widths)
    con = common.console()
    figures: dict[str, Any] = {
        "widths": widths,
        "commit": common.git_commit(),
        "load_before": os.getloadavg(),
        "stages": {},
    }
    for n in blocks:
        t0 = time.perf_counter()
        stages = {"unrolled": _build(spec, n, False), "scan": _build(spec, n, True)}
        samples = _time(stages, args.rounds, args.repeats)
        out: dict[str, Any] = {"build_and_time_s": time.perf_counter() - t0}
        for name, st in stages.items():
            out[name] = {k: v for k, v in st.items() if k != "runs"}
            out[name]["compile_total_s"] = sum(st["compile_s"].values())
            for module, got in samples[name].items():
                out[name][module] = _summary(got)
        u, s = out["unrolled"], out["scan"]
        agree = {}
        for module in ("forward", "backward"):
            mu, ms = u[module]["median_ms"], s[module]["median_ms"]
            agree[module] = abs(ms - mu) / mu <= max(u[module]["spread"], s[module]["spread"])
        out["agree_within_spread"] = agree
        rows: list[tuple[str, Any, Any]] = [
            ("compile s forward", u["compile_s"]["forward"], s["compile_s"]["forward"]),
            ("compile s backward", u["compile_s"]["backward"], s["compile_s"]["backward"]),
            ("compile s apply_grad", u["compile_s"]["apply_grad"], s["compile_s"]["apply_grad"]),
            ("compile s total", u["compile_total_s"], s["compile_total_s"]),
            ("one-layer FLOPs compiles s (first stage only)", "-", s["layer_flops_compile_s"]),
        ]
        for module in ("forward", "backward"):
            rows.append(
                (
                    f"{module} ms median (spread)",
                    f"{u[module]['median_ms']:.3f} ({u[module]['spread']:.0%})",
                    f"{s[module]['median_ms']:.3f} ({s[module]['spread']:.0%})",
                )
            )
        rows += [
            ("MFLOP forward", u["mflop"]["forward"], s["mflop"]["forward"]),
            ("MFLOP backward", u["mflop"]["backward"], s["mflop"]["backward"]),
            ("stash bytes (intermediate_size)", u["intermediate_size"], s["intermediate_size"]),
            ("peak bytes forward", u["peak_bytes"]["forward"], s["peak_bytes"]["forward"]),
            ("peak bytes backward", u["peak_bytes"]["backward"], s["peak_bytes"]["backward"]),
            ("times agree within spread (fwd, bwd)", "-", str(tuple(agree.values()))),
        ]
        con.print(common.side_by_side(f"stage of {n} blocks", rows, ("unrolled", "scan")))
        figures["stages"][str(n)] = out
    figures["load_after"] = os.getloadavg()
    common.emit_json(figures)


if __name__ == "__main__":
    main()
