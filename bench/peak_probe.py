"""The device's high-water mark while one stage's forward then backward run, as the workers
compile and run them: `Device.memory_stats()["peak_bytes_in_use"]` in a fresh process (the
mark never goes down, so each stage gets its own). Where the backend keeps no memory
statistics (CPU) the modules still run and the mark is None, with the reason.

Usage (bench/gpu_check.py runs it): python bench/peak_probe.py SPEC_JSON START END
Prints one JSON object."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# As bench/gpu_check.py: grow device memory on demand (set before jax is imported).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import common  # noqa: E402,F401  (puts the checkout on sys.path)

PROBE_TIMEOUT_S = 1800

PROBE_KEYS = (
    "device_peak_bytes",
    "device_peak_unavailable",
    "device_in_use_before_run_bytes",
    "device_peak_after_compile_bytes",
)


def memory_stats_reason(device: Any) -> str | None:
    """None when `device.memory_stats()` has `peak_bytes_in_use`, else why not."""
    try:
        stats = device.memory_stats()
    except Exception as err:  # some backends raise instead of returning None
        return f"{device.platform}: Device.memory_stats() failed: {type(err).__name__}: {err}"
    if stats is None:
        return f"{device.platform}: Device.memory_stats() is None (no allocator statistics)"
    if "peak_bytes_in_use" not in stats:
        return f"{device.platform}: Device.memory_stats() has no peak_bytes_in_use"
    return None


def probe_peak(spec: Any, start: int, end: int) -> dict[str, Any]:
    """Compile layers start..end's forward and backward as the workers do, run forward then
    backward once on the workers' arrays, and read the device's high-water mark (fresh
    process: the mark never goes down). On a backend without memory statistics the modules
    still run and the peak is None with the reason."""
    import jax

    from schemas import ShardingConfig
    from workers.measure.compose import compose_stage
    from workers.measure.sharding import make_mesh, stage_shardings
    from workers.measure.stage_modules import StageModules
    from workers.measure.timing import random_array

    dev = jax.devices()[0]
    reason = memory_stats_reason(dev)

    def stat(key: str) -> int | None:
        return None if reason else int(dev.memory_stats()[key])

    config = ShardingConfig(logical_mesh=(1, 1), strategy="data")
    program = compose_stage(spec, start, end)
    shardings = stage_shardings(make_mesh([dev], config), config, program.params, program.inputs)
    modules = StageModules(program, shardings, "adam")
    fwd, bwd = modules.compile_forward().compiled, modules.compile_backward().compiled
    after_compile = stat("peak_bytes_in_use")
    params = [random_array(s, i) for i, s in enumerate(modules.param_structs)]
    inputs = [random_array(s, 1000 + i) for i, s in enumerate(modules.input_structs)]
    before_run = stat("bytes_in_use")
    outs, stash, _ = fwd(params, inputs)
    cot = jax.block_until_ready(tuple(jax.numpy.ones_like(o) for o in outs))
    del outs, inputs  # the backward reads params, stash and cotangents only
    jax.block_until_ready(bwd(params, stash, cot))
    peak = stat("peak_bytes_in_use")
    return {
        "device_peak_bytes": peak,
        "device_peak_unavailable": reason,
        "device_in_use_before_run_bytes": before_run,
        "device_peak_after_compile_bytes": after_compile,
    }


def probe_in_child(spec_path: Path, start: int, end: int) -> dict[str, Any]:
    """`probe_peak` in a fresh process of this script; its last stdout line."""
    try:
        proc = subprocess.run(
            [sys.executable, __file__, str(spec_path), str(start), str(end)],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {
            "device_peak_bytes": None,
            "device_peak_unavailable": f"probe ran past {PROBE_TIMEOUT_S} s",
        }
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        return {"device_peak_bytes": None, "device_peak_unavailable": f"probe failed: {tail}"}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    from schemas import ModelSpec

    path, start, end = argv if argv is not None else sys.argv[1:]
    spec = ModelSpec.model_validate_json(Path(path).read_text())
    print(json.dumps(probe_peak(spec, int(start), int(end))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
