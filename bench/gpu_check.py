"""GPU check: stageprof's stage figures next to what the device itself says, on whatever
accelerator JAX's default backend is (a GPU when there is one, else the CPU).

A GPT from the zoo is traced with the SDK (`client.zoo`, `client.trace`); stages of 1, 2 and
4 blocks and the whole model are measured with the workers' own code
(`workers.measure.measure_stage_on`: one device, data strategy), and each is put beside:

- its predicted `peak_memory` (max of forward and backward) vs the device's high-water mark
  (`Device.memory_stats()["peak_bytes_in_use"]`) while the stage's compiled forward then
  backward run, read in a fresh process per stage (the mark only ever rises); where the
  backend keeps no memory statistics (CPU) it is reported unavailable, with the reason;
- its forward + backward time vs one jitted `jax.vjp` step (value and VJP) of the plain,
  un-exported JAX function of the same blocks;
- `intermediate_size` vs the bytes of that VJP's residuals; its FLOPs vs `cost_analysis()`
  of the direct step; the compile seconds of both.

Needs JAX, numpy, optax, pydantic (and flatbuffers for `jax.export`) plus this checkout's
`schemas`, `programs`, `planner`, `client` and `workers.measure`: no Ray, database, server
or rich. Usage:

    python bench/gpu_check.py [--small] [--layers 4] [--hidden 1024] [--heads 16] [--seq 1024]
        [--batch 8] [--vocab 51200] [--json-out PATH]

It prints a table, then, as its LAST line, one JSON object with every figure.
"""

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Grow device memory on demand: a preallocating parent would leave the per-stage probe
# processes (bench/peak_probe.py) no room. Set before jax is imported; a caller's value stays.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import common  # noqa: E402  (bench/common.py: puts the checkout on sys.path; rich-free)
import direct_vjp  # noqa: E402
import peak_probe  # noqa: E402

# Sized for one H100 (GPT-350M's widths, 4 blocks: a few seconds per stage) and for a
# 2-core CPU in under a minute (--small).
DEFAULT = {"layers": 4, "hidden": 1024, "heads": 16, "seq": 1024, "batch": 8, "vocab": 51200}
SMALL = {"layers": 4, "hidden": 64, "heads": 4, "seq": 32, "batch": 4, "vocab": 256}
# Timing as the workers' defaults (PlanOptions); --small caps the runs.
TIMING = {"repeats": 5, "max_repeats": 40, "warmup": 1}
SMALL_TIMING = {"repeats": 3, "max_repeats": 5, "warmup": 1}

# Every figure of a stage row (the JSON's `stages[i]`), in table order.
ROW_KEYS = (
    "stage",
    "start",
    "end",
    "status",
    "error",
    "predicted_peak_bytes",
    "predicted_forward_peak_bytes",
    "predicted_backward_peak_bytes",
    "device_peak_bytes",
    "device_peak_unavailable",
    "device_in_use_before_run_bytes",
    "device_peak_after_compile_bytes",
    "stage_time_s",
    "forward_time_s",
    "backward_time_s",
    "direct_time_s",
    "direct_error",
    "intermediate_size",
    "direct_residual_bytes",
    "flops",
    "direct_flops",
    "compile_s",
    "direct_compile_s",
    "apply_grad_compile_s",
    "ratios",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, value in DEFAULT.items():
        parser.add_argument(f"--{name}", type=int, help=f"default {value} (--small {SMALL[name]})")
    parser.add_argument("--small", action="store_true", help="a tiny GPT (CPU, < 1 minute)")
    parser.add_argument("--json-out", type=Path, help="also write the JSON object here")
    return parser.parse_args(argv)


def config_from(args: argparse.Namespace) -> dict[str, int]:
    """The GPT's sizes: --small's or the default, each overridable; ValueError when bad."""
    base = SMALL if args.small else DEFAULT
    cfg = {k: getattr(args, k) or v for k, v in base.items()}
    if cfg["layers"] < 4:
        raise ValueError(f"--layers must be at least 4 (stages of 1, 2, 4 blocks), got {cfg}")
    if cfg["hidden"] % cfg["heads"]:
        raise ValueError(f"--hidden {cfg['hidden']} must be divisible by --heads {cfg['heads']}")
    return cfg


def stages(layers: int) -> list[tuple[str, int, int]]:
    """(name, start, end) of the stages checked: 1, 2 and 4 blocks, then the whole model
    (layer 0 is the embedding, layers+1 the head)."""
    out = [(f"{n} block{'s' if n > 1 else ''}", 1, n) for n in (1, 2, 4)]
    return [*out, ("whole model", 0, layers + 1)]


# ----- the direct reference: plain JAX of the same blocks ---------------------------------
def gpt_block(heads: int, p: dict, x: Any) -> Any:
    """One block of the zoo's GPT (`client.zoo.gpt`): attention then MLP."""
    from client.zoo import transformer as tf

    return tf.mlp(p, tf.attention(p, x, heads))


def direct_function(built: Any, cfg: dict[str, int], start: int, end: int) -> Any:
    """The plain function of layers start..end over a flat {param name: array} dict (the
    names of the traced spec): blocks -> `f(params, x)`, whole model -> `f(params, tokens,
    labels)` (the zoo's un-traced loss)."""
    import jax

    from client.tracing import path_name

    if start == 0:
        paths = jax.tree_util.tree_flatten_with_path(built.params)[0]
        names = [path_name(path) for path, _ in paths]
        tree = jax.tree_util.tree_structure(built.params)

        def loss(params: dict, tokens: Any, labels: Any) -> Any:
            p = jax.tree_util.tree_unflatten(tree, [params[n] for n in names])
            return built.loss_fn(p, {"tokens": tokens, "labels": labels})

        return loss
    keys = sorted(built.params["blocks"][0])

    def blocks(params: dict, x: Any) -> Any:
        for i in range(start - 1, end):
            x = gpt_block(cfg["heads"], {k: params[f"blocks/{i}/{k}"] for k in keys}, x)
        return x

    return blocks


def measure_direct(
    fn: Any, program: Any, whole: bool, options: Any, budget_s: float
) -> dict[str, Any]:
    """One jitted step `(value, vjp(ct))` of `fn` on arrays made as the workers make them:
    its compile seconds, FLOPs, time (the workers' timing rule) and residual bytes."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    from workers.measure.timing import median, random_array

    on_dev = SingleDeviceSharding(jax.devices()[0])
    params = {
        p.name: random_array(jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=on_dev), i)
        for i, p in enumerate(program.params)
    }
    inputs = [
        random_array(jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=on_dev), 1000 + i)
        for i, v in enumerate(program.inputs)
    ]
    if whole:  # differentiate the loss w.r.t. the parameters; tokens and labels ride along

        def step(p: dict, ins: list, ct: Any) -> Any:
            y, vjp = jax.vjp(lambda q: fn(q, *ins), p)
            return y, vjp(ct)

        ct = jnp.ones((), jnp.float32)
        count, stash = direct_vjp.vjp_residual_bytes(lambda q: fn(q, *inputs), params)
    else:

        def step(p: dict, ins: list, ct: Any) -> Any:
            y, vjp = jax.vjp(fn, p, *ins)
            return y, vjp(ct)

        ct = jnp.ones_like(inputs[0])
        count, stash = direct_vjp.vjp_residual_bytes(fn, params, *inputs)
    compiled, compile_s, _ = direct_vjp.compile_timed(step, params, inputs, ct)
    samples = direct_vjp.time_module(
        lambda: compiled(params, inputs, ct),
        options.warmup,
        options.repeats,
        "direct step",
        max_repeats=options.max_repeats,
        target_spread=options.target_spread,
        budget_s=budget_s,
    )
    return {
        "direct_time_s": median(samples),
        "direct_samples_s": samples,
        "direct_flops": direct_vjp.flops(compiled),
        "direct_compile_s": compile_s,
        "direct_residual_bytes": stash,
        "direct_residual_values": count,
    }


# ----- ours: the workers' measurement ----------------------------------------------------
def measure_ours(spec: Any, start: int, end: int, cluster: Any, options: Any) -> dict[str, Any]:
    """`measure_stage_on` of layers start..end on one device (data strategy)."""
    from schemas import ModuleKind, ShardingConfig, SubmeshShape
    from workers.measure import measure_stage_on

    one = SubmeshShape(hosts=1, devices_per_host=1)
    config = ShardingConfig(logical_mesh=(1, 1), strategy="data")
    result = measure_stage_on(spec, start, end, one, config, cluster, options)
    modules = {k: result.module(k) for k in ModuleKind}
    fwd, bwd = modules.get(ModuleKind.forward), modules.get(ModuleKind.backward)
    apply = modules.get(ModuleKind.apply_grad)
    out: dict[str, Any] = {"status": result.status.value, "error": result.error}
    if fwd is None or bwd is None:
        return out
    return out | {
        "predicted_peak_bytes": max(fwd.peak_memory, bwd.peak_memory),
        "predicted_forward_peak_bytes": fwd.peak_memory,
        "predicted_backward_peak_bytes": bwd.peak_memory,
        "forward_time_s": fwd.compute_cost,
        "backward_time_s": bwd.compute_cost,
        "stage_time_s": fwd.compute_cost + bwd.compute_cost if result.ok else None,
        "intermediate_size": result.intermediate_size,
        "flops": fwd.flops + bwd.flops,
        "compile_s": fwd.compile_seconds + bwd.compile_seconds,
        "apply_grad_compile_s": apply.compile_seconds if apply is not None else None,
    }


# ----- rows, table, JSON (pure) ----------------------------------------------------------
def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, int | float) and isinstance(b, int | float) and b else None


def stage_row(
    name: str, start: int, end: int, ours: dict, direct: dict, probe: dict
) -> dict[str, Any]:
    """One stage's figures: every key of ROW_KEYS (None where not measured), the samples,
    and the ratios ours / reference."""
    merged = {"stage": name, "start": start, "end": end} | ours | direct | probe
    row = {k: merged.get(k) for k in ROW_KEYS if k != "ratios"}
    row["direct_samples_s"] = merged.get("direct_samples_s", [])
    row["ratios"] = {
        "peak_predicted_over_device": _ratio(row["predicted_peak_bytes"], row["device_peak_bytes"]),
        "time_over_direct": _ratio(row["stage_time_s"], row["direct_time_s"]),
        "intermediate_over_residuals": _ratio(
            row["intermediate_size"], row["direct_residual_bytes"]
        ),
        "flops_over_direct": _ratio(row["flops"], row["direct_flops"]),
        "compile_over_direct": _ratio(row["compile_s"], row["direct_compile_s"]),
    }
    return row


def _mib(n: Any) -> str:
    return "-" if n is None else f"{n / 2**20:.2f} MiB"


def _ms(s: Any) -> str:
    return "-" if s is None else f"{s * 1e3:.2f} ms"


def _gflop(n: Any) -> str:
    return "-" if n is None else f"{n / 1e9:.3f} GFLOP"


def _secs(s: Any) -> str:
    return "-" if s is None else f"{s:.2f} s"


def _x(r: Any) -> str:
    return "-" if r is None else f"{r:.3f}"


def format_table(device: str, rows: list[dict[str, Any]]) -> str:
    """The plain-text table: per stage, each figure of stageprof beside the device's or the
    direct step's, and their ratio."""
    head = ("figure", "stageprof", "device / direct", "ratio")
    lines = [f"GPU check on {device}", ""]
    for row in rows:
        r = row["ratios"]
        peak = (
            _mib(row["device_peak_bytes"])
            if row["device_peak_bytes"] is not None
            else "unavailable"
        )
        table = [
            ("peak memory (predicted | high-water)", _mib(row["predicted_peak_bytes"]), peak,
             _x(r["peak_predicted_over_device"])),
            ("forward + backward time (| jax.vjp step)", _ms(row["stage_time_s"]),
             _ms(row["direct_time_s"]), _x(r["time_over_direct"])),
            ("stash (intermediate_size | residuals)", _mib(row["intermediate_size"]),
             _mib(row["direct_residual_bytes"]), _x(r["intermediate_over_residuals"])),
            ("FLOPs fwd + bwd (| cost_analysis)", _gflop(row["flops"]),
             _gflop(row["direct_flops"]), _x(r["flops_over_direct"])),
            ("compile fwd + bwd (| the step)", _secs(row["compile_s"]),
             _secs(row["direct_compile_s"]), _x(r["compile_over_direct"])),
        ]  # fmt: skip
        title = f"{row['stage']} (layers {row['start']}..{row['end']}): {row['status']}"
        lines.append(title + (f": {row['error']}" if row.get("error") else ""))
        if row.get("direct_error"):
            lines.append(f"  the direct step failed: {row['direct_error']}")
        widths = [max(len(str(c[i])) for c in [head, *table]) for i in range(4)]
        for cells in [head, *table]:
            lines.append(
                "  "
                + cells[0].ljust(widths[0])
                + "".join(f"  {c:>{w}}" for c, w in zip(cells[1:], widths[1:], strict=True))
            )
        if row["device_peak_bytes"] is None and row.get("device_peak_unavailable"):
            lines.append(f"  high-water mark unavailable: {row['device_peak_unavailable']}")
        elif row["device_peak_bytes"] is not None:
            lines.append(
                f"  in use before the run (parameters, inputs): "
                f"{_mib(row['device_in_use_before_run_bytes'])}; mark after compiling: "
                f"{_mib(row['device_peak_after_compile_bytes'])}"
                + (
                    " (the run did not raise it: an upper bound set while compiling)"
                    if row["device_peak_bytes"] == row["device_peak_after_compile_bytes"]
                    else ""
                )
            )
        lines.append("")
    return "\n".join(lines)


def figures(meta: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON object: the run's facts and one row per stage."""
    ok = all(r["status"] == "ok" and not r.get("direct_error") for r in rows)
    return meta | {"stages": rows, "all_ok": ok}


# ----- main --------------------------------------------------------------------------------
def device_facts(device: Any) -> dict[str, Any]:
    import jax
    import jaxlib

    reason = peak_probe.memory_stats_reason(device)
    limit = None if reason else device.memory_stats().get("bytes_limit")
    return {
        "platform": device.platform,
        "device_kind": device.device_kind,
        "device_count": len(jax.devices()),
        "memory_stats": reason is None,
        "bytes_limit": limit,
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        "python": platform.python_version(),
    }


def run_check(cfg: dict[str, int], small: bool) -> dict[str, Any]:
    import jax

    import client
    from client import zoo
    from schemas import ClusterSpec, PlanOptions
    from workers.measure.compose import compose_stage
    from workers.measure.stage import TIMING_BUDGET_S

    began = time.perf_counter()
    device = jax.devices()[0]
    facts = device_facts(device)
    memory = facts["bytes_limit"] or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cluster = ClusterSpec(
        num_hosts=1,
        devices_per_host=1,
        device_kind=device.device_kind[:64],
        device_memory_bytes=int(memory),
    )
    timing = SMALL_TIMING if small else TIMING
    options = PlanOptions(**timing, schedule="1f1b", prune=False, candidate_timeout_s=3600)
    sizes = {
        "num_layers": cfg["layers"],
        "hidden_size": cfg["hidden"],
        "num_heads": cfg["heads"],
        "seq_len": cfg["seq"],
        "vocab_size": cfg["vocab"],
        "batch_size": cfg["batch"],
    }
    built = zoo.make("gpt", **sizes)
    t0 = time.perf_counter()
    spec = client.trace(
        built.loss_fn, built.params, built.batch, name="gpt", logical_axes=built.logical_axes
    )
    trace_s = time.perf_counter() - t0
    checked = stages(cfg["layers"])
    reason = peak_probe.memory_stats_reason(device)
    probes: dict[int, dict[str, Any]] = {}
    if reason is None:  # before this process holds any device memory
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "spec.json"
            path.write_text(spec.model_dump_json())
            for i, (_, start, end) in enumerate(checked):
                probes[i] = peak_probe.probe_in_child(path, start, end)
    rows = []
    for i, (name, start, end) in enumerate(checked):
        ours = measure_ours(spec, start, end, cluster, options)
        try:
            direct = measure_direct(
                direct_function(built, cfg, start, end),
                compose_stage(spec, start, end),
                start == 0,
                options,
                TIMING_BUDGET_S,
            )
        except Exception as err:  # an OOM of the reference must not end the other stages
            direct = {"direct_error": f"{type(err).__name__}: {err}"[:2000]}
        probe = probes.get(i, {"device_peak_bytes": None, "device_peak_unavailable": reason})
        rows.append(stage_row(name, start, end, ours, direct, probe))
    meta = {
        "check": "gpu_check",
        "device": facts,
        "model": "zoo gpt traced with client.trace",
        "config": cfg | {"dtype": "float32"},
        "small": small,
        "timing": timing,
        "trace_s": trace_s,
        "wall_s": round(time.perf_counter() - began, 1),
        "commit": common.git_commit(),
        "project_from": str(Path(sys.modules["workers"].__file__ or "").resolve().parents[1]),
    }
    return figures(meta, rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_logging()
    try:
        cfg = config_from(args)
    except ValueError as err:
        raise SystemExit(str(err)) from err
    figs = run_check(cfg, args.small)
    d = figs["device"]
    device = f"{d['device_kind']} ({d['platform']}), jax {d['jax_version']}"
    print(format_table(device, figs["stages"]), flush=True)
    if args.json_out:
        args.json_out.write_text(common.json_text(figs) + "\n")
    common.emit_json(figs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
