"""The extra cost of measuring the split backward (B and W) for zero-bubble schedules.

The 16-block GPT of the time-to-plan benchmark (zoo `gpt`, `common.GPT_WIDTHS`); stages of
1, 4 and 16 blocks (layers block0..), one CPU device, data strategy. Each stage is measured
by `workers.measure.measure_stage_on` twice: with schedule `1f1b` (forward, backward,
apply_grad) and `zb-h1` (the same plus B and W). Printed side by side: wall seconds of the
whole measurement, compile seconds (sum over modules) and this process's CPU seconds, the
module times, the FLOPs of B + W against the backward's (compiled programs, and lowered ones,
where they are equal by construction), and the stash B keeps for W.

Usage: python bench/split_backward.py [--blocks 1 4 16] [--layers 16] [--repeats 3] [--quick]
The last line printed is one JSON object with every figure.
"""

import argparse
import os
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import common  # bench/common.py (the script's directory is on sys.path)


def _measure(spec: Any, end: int, schedule: str, repeats: int) -> dict[str, Any]:
    from schemas import ClusterSpec, ModuleKind, PlanOptions, ShardingConfig, SubmeshShape
    from workers.measure import measure_stage_on

    options = PlanOptions(
        repeats=repeats, max_repeats=repeats, warmup=1, prune=False, schedule=schedule
    )
    cluster = ClusterSpec(num_hosts=1, devices_per_host=1, device_kind="cpu")
    wall, cpu = time.perf_counter(), time.process_time()
    r = measure_stage_on(
        spec,
        1,
        end,
        SubmeshShape(hosts=1, devices_per_host=1),
        ShardingConfig(logical_mesh=(1, 1), strategy="data"),
        cluster,
        options,
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if not r.ok:
        raise RuntimeError(f"stage 1..{end} {schedule}: {r.status.value}: {r.error}")
    out: dict[str, Any] = {
        "wall_s": wall,
        "cpu_s": cpu,
        "compile_s": r.compile_seconds,
        "intermediate_size": r.intermediate_size,
        "weight_stash_size": r.weight_stash_size,
    }
    for kind in ModuleKind:
        m = r.module(kind)
        if m is not None:
            out[f"{kind.value}_ms"] = m.compute_cost * 1e3
            out[f"{kind.value}_compile_s"] = m.compile_seconds
            out[f"{kind.value}_mflop"] = m.flops / 1e6
    return out


def _lowered_flops(spec: Any, end: int) -> tuple[float, float, float]:
    """FLOPs of the lowered backward, B and W (before XLA's optimizations)."""
    import jax

    from workers.measure.compose import compose_stage
    from workers.measure.compose_split import compose_split_backward

    program = compose_stage(spec, 1, end)
    split = compose_split_backward(spec, 1, end, program)
    params = [jax.ShapeDtypeStruct(p.shape, p.dtype) for p in program.params]
    inputs = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in program.inputs]
    outs, stash = jax.eval_shape(program.forward, params, inputs)
    cot = tuple(outs[i] for i in program.diff_outputs)
    _, handoff = jax.eval_shape(split.input_grad, params, stash, cot)

    def flops(fn: Any, *args: Any) -> float:
        return float(jax.jit(fn).lower(*args).cost_analysis()["flops"])

    return (
        flops(program.backward, params, stash, cot),
        flops(split.input_grad, params, stash, cot),
        flops(split.weight_grad, params, stash, handoff),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--layers", type=int, default=16, help="transformer blocks")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny widths, 1 and 2 blocks")
    args = parser.parse_args()
    common.setup_logging()
    from client import zoo

    widths = common.QUICK_WIDTHS if args.quick else common.GPT_WIDTHS
    blocks = [1, 2] if args.quick else args.blocks
    spec = zoo.build("gpt", num_layers=max(args.layers, *blocks), **widths)
    con = common.console()
    figures: dict[str, Any] = {"widths": widths, "layers": spec.num_layers, "stages": {}}
    for n in blocks:
        plain = _measure(spec, n, "1f1b", args.repeats)
        split = _measure(spec, n, "zb-h1", args.repeats)
        low_bwd, low_b, low_w = _lowered_flops(spec, n)
        rows = [
            ("measurement wall s", plain["wall_s"], split["wall_s"]),
            ("measurement CPU s", plain["cpu_s"], split["cpu_s"]),
            ("compile s (all modules)", plain["compile_s"], split["compile_s"]),
            ("forward ms", plain["forward_ms"], split["forward_ms"]),
            ("backward ms", plain["backward_ms"], split["backward_ms"]),
            (
                "B ms / W ms",
                "-",
                f"{split['backward_input_ms']:.3f} / {split['backward_weight_ms']:.3f}",
            ),
            (
                "B + W compile s",
                "-",
                split["backward_input_compile_s"] + split["backward_weight_compile_s"],
            ),
            ("MFLOP backward (compiled)", plain["backward_mflop"], split["backward_mflop"]),
            (
                "MFLOP B + W (compiled)",
                "-",
                split["backward_input_mflop"] + split["backward_weight_mflop"],
            ),
            (
                "MFLOP backward / B + W (lowered)",
                "-",
                f"{low_bwd / 1e6:.4f} / {(low_b + low_w) / 1e6:.4f}",
            ),
            ("stash for backward (bytes)", plain["intermediate_size"], split["intermediate_size"]),
            ("weight_stash_size (bytes)", plain["weight_stash_size"], split["weight_stash_size"]),
        ]
        con.print(common.side_by_side(f"stage of {n} block(s)", rows, ("1f1b", "zb-h1")))
        figures["stages"][str(n)] = {
            "1f1b": plain,
            "zb-h1": split,
            "lowered_mflop": {"backward": low_bwd / 1e6, "b": low_b / 1e6, "w": low_w / 1e6},
        }
    common.emit_json(figures)


if __name__ == "__main__":
    main()
