"""Measuring a direct program beside what stageprof measures: compile it timed, read its
FLOPs and memory, time it as the workers time a module, and count the residuals a
`jax.vjp` keeps. Shared by bench/stage_fidelity.py and bench/gpu_check.py; needs only jax
and `workers.measure` (no rich, no database, no Ray)."""

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any


@contextlib.contextmanager
def slot(kind: str) -> Iterator[None]:
    """The section `measure_stage_on` compiles or times in (`workers.measure.quiet`)."""
    from workers.measure import quiet

    with quiet.compile_slot() if kind == "compile" else quiet.timing_slot():
        yield


def timed_build(build: Callable[[], Any]) -> tuple[Any, float, float]:
    """`build()`, its wall seconds and this process's CPU seconds."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = build()
    return out, time.perf_counter() - t0, time.process_time() - c0


def compile_timed(fn: Callable, *args: Any) -> tuple[Any, float, float]:
    """`jax.jit(fn).lower(*args).compile()`, its wall seconds (tracing and lowering
    included, as ours) and this process's CPU seconds over it (less sensitive to other
    processes on the machine). `fn` is wrapped in a fresh function each call so that no
    call hits jax's caches of traced, lowered or compiled programs."""
    import jax

    def fresh(*a: Any) -> Any:
        return fn(*a)

    with slot("compile"):
        return timed_build(lambda: jax.jit(fresh).lower(*args).compile())


def time_module(
    run: Callable[[], Any],
    warmup: int,
    repeats: int,
    phase: str,
    *,
    max_repeats: int | None = None,
    target_spread: float | None = None,
    budget_s: float | None = None,
) -> list[float]:
    """`workers.measure.timing.time_runs` as `measure_stage_on` calls it, with its clock:
    `repeats` timed runs, or (with `max_repeats` and `target_spread`) the workers' adaptive
    rule. Returns the samples, seconds."""
    import jax

    from workers.measure.timing import Deadline, clock_for, time_runs

    clock = clock_for(jax.devices())
    with slot("timing"):
        samples, _ = time_runs(
            run,
            warmup,
            repeats,
            Deadline(math.inf),
            phase,
            max_repeats=max_repeats,
            target_spread=target_spread,
            budget_s=budget_s,
            clock=clock,
        )
    return samples


def memory(compiled: Any) -> dict[str, int]:
    """memory_analysis(): the raw figures, XLA's peak and args + outputs + temps - alias."""
    stats = compiled.memory_analysis()
    fig = {
        k: int(getattr(stats, f"{k}_size_in_bytes", 0) or 0)
        for k in ("argument", "output", "temp", "alias")
    }
    fig["xla_peak"] = int(getattr(stats, "peak_memory_in_bytes", 0) or 0)
    fig["args_outs_temps"] = fig["argument"] + fig["output"] + fig["temp"] - fig["alias"]
    return fig


def flops(compiled: Any) -> float:
    """FLOPs of a compiled program from `cost_analysis()` (a dict; a list in older jax)."""
    costs = compiled.cost_analysis() or {}
    if isinstance(costs, list):
        costs = costs[0] if costs else {}
    return float(costs.get("flops", 0.0))


def residuals(leaves: Sequence[Any], primals: Any) -> tuple[int, int, int]:
    """What a VJP keeps, from its flattened leaves (at trace time): the number and bytes of
    the unique (by id) leaves that are not among the differentiated parameters `primals`
    (batch inputs the VJP keeps count), and the bytes of all leaves."""
    import jax

    param_ids = {id(x) for x in jax.tree_util.tree_leaves(primals)}
    kept = {id(x): x for x in leaves if id(x) not in param_ids}
    kept_bytes = sum(int(x.size) * x.dtype.itemsize for x in kept.values())
    leaf_bytes = sum(int(x.size) * x.dtype.itemsize for x in leaves)
    return len(kept), kept_bytes, leaf_bytes


def vjp_residual_bytes(fn: Callable[..., Any], params: Any, *args: Any) -> tuple[int, int]:
    """The number and bytes of the residuals `jax.vjp(fn, params, *args)` keeps, beyond
    `params` (args the VJP reads count): traced only (`jax.eval_shape`), nothing compiled."""
    import jax

    found: dict[str, int] = {}

    def forward(p: Any, *a: Any) -> Any:
        _, vjp = jax.vjp(fn, p, *a)
        leaves = jax.tree_util.tree_leaves(vjp)
        found["count"], found["bytes"], _ = residuals(leaves, p)
        return leaves

    jax.eval_shape(forward, params, *args)
    return found["count"], found["bytes"]
