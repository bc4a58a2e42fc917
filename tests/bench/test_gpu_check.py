"""bench/gpu_check.py: its rows, table and JSON (pure functions), its direct reference (the
same computation as the composed stage), its peak probe on the CPU, and a --small run in a
process where Ray, the database, the server, rich and the other worker rooms cannot be
imported."""

import json
import os
import subprocess
import sys
from pathlib import Path

import common  # bench/, on sys.path through tests/bench/conftest.py
import gpu_check
import pytest

from tests.support.scripts import BENCH, ROOT

# Modules the check must run without: a bare GPU image has none of them.
BLOCKED = (
    "ray",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "fastapi",
    "uvicorn",
    "httpx",
    "rich",
    "flax",
    "store",
    "server",
    "migrations",
    "cli",
    "workers.cluster",
    "workers.jobs",
)

# Installed first in the child: imports of BLOCKED raise, and the shared venv's editable
# install of another checkout is taken out (the packages must come from this checkout).
BLOCKER = f"""
import sys
BLOCKED = {BLOCKED!r}
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"{{name}} is blocked: the GPU check must not need it")
        return None
sys.meta_path[:] = [Blocker()] + [f for f in sys.meta_path if "editable" not in repr(f)]
sys.path.insert(0, {str(BENCH)!r})
"""


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "XLA_FLAGS")}
    env["PYTHONPATH"] = ""  # the checkout is found from the script's own directory
    env["JAX_PLATFORMS"] = "cpu"
    return env


def fake_row(device_peak: int | None) -> dict:
    ours = {
        "status": "ok",
        "error": None,
        "predicted_peak_bytes": 4 * 2**20,
        "predicted_forward_peak_bytes": 3 * 2**20,
        "predicted_backward_peak_bytes": 4 * 2**20,
        "forward_time_s": 0.001,
        "backward_time_s": 0.002,
        "stage_time_s": 0.003,
        "intermediate_size": 2 * 2**20,
        "flops": 3e9,
        "compile_s": 1.5,
        "apply_grad_compile_s": 0.5,
    }
    direct = {
        "direct_time_s": 0.002,
        "direct_samples_s": [0.002, 0.0021],
        "direct_flops": 2e9,
        "direct_compile_s": 1.0,
        "direct_residual_bytes": 2**20,
        "direct_residual_values": 7,
    }
    probe = {
        "device_peak_bytes": device_peak,
        "device_peak_unavailable": None if device_peak else "cpu: no statistics",
        "device_in_use_before_run_bytes": None,
        "device_peak_after_compile_bytes": None,
    }
    return gpu_check.stage_row("2 blocks", 1, 2, ours, direct, probe)


def test_rows_table_and_json_shape() -> None:
    cpu, gpu = fake_row(None), fake_row(8 * 2**20)
    gpu |= {"device_in_use_before_run_bytes": 2**20, "device_peak_after_compile_bytes": 8 * 2**20}
    for row in (cpu, gpu):
        assert set(row) == set(gpu_check.ROW_KEYS) | {"direct_samples_s"}
        assert row["ratios"]["time_over_direct"] == pytest.approx(1.5)
        assert row["ratios"]["flops_over_direct"] == pytest.approx(1.5)
        assert row["ratios"]["intermediate_over_residuals"] == pytest.approx(2.0)
        assert row["ratios"]["compile_over_direct"] == pytest.approx(1.5)
    assert cpu["ratios"]["peak_predicted_over_device"] is None
    assert gpu["ratios"]["peak_predicted_over_device"] == pytest.approx(0.5)

    text = gpu_check.format_table("cpu (cpu), jax x", [cpu, gpu])
    lines = text.splitlines()
    assert lines[0] == "GPU check on cpu (cpu), jax x"
    assert sum(line.startswith("2 blocks (layers 1..2): ok") for line in lines) == 2
    assert "unavailable" in text and "high-water mark unavailable: cpu: no statistics" in text
    assert "8.00 MiB" in text and "4.00 MiB" in text and "3.00 ms" in text
    assert "3.000 GFLOP" in text and "1.50 s" in text and "0.500" in text
    # the GPU row says what was in use before the run, and that compiling set the mark
    assert "in use before the run (parameters, inputs): 1.00 MiB" in text
    assert "the run did not raise it" in text

    figs = gpu_check.figures({"check": "gpu_check"}, [cpu, gpu])
    back = json.loads(common.json_text(figs))
    assert back["all_ok"] is True and len(back["stages"]) == 2
    assert back["stages"][0]["device_peak_bytes"] is None
    failed = fake_row(None) | {"status": "oom"}
    assert gpu_check.figures({}, [cpu, failed])["all_ok"] is False
    broken = fake_row(None) | {"direct_error": "XlaRuntimeError: RESOURCE_EXHAUSTED"}
    assert gpu_check.figures({}, [broken])["all_ok"] is False
    assert "the direct step failed: XlaRuntimeError" in gpu_check.format_table("d", [broken])


def test_config_and_stages() -> None:
    args = gpu_check.parse_args(["--small", "--hidden", "96", "--heads", "3"])
    cfg = gpu_check.config_from(args)
    assert cfg == gpu_check.SMALL | {"hidden": 96, "heads": 3}
    assert gpu_check.config_from(gpu_check.parse_args([])) == gpu_check.DEFAULT
    with pytest.raises(ValueError, match="--layers must be at least 4"):
        gpu_check.config_from(gpu_check.parse_args(["--small", "--layers", "3"]))
    with pytest.raises(ValueError, match="divisible by --heads"):
        gpu_check.config_from(gpu_check.parse_args(["--hidden", "100", "--heads", "16"]))
    assert gpu_check.stages(4) == [
        ("1 block", 1, 1),
        ("2 blocks", 1, 2),
        ("4 blocks", 1, 4),
        ("whole model", 0, 5),
    ]


def test_direct_reference_is_the_stage_and_probe_on_cpu() -> None:
    """The plain function of the blocks (and the zoo's loss) computes what the composed,
    exported stage computes; the probe runs the stage and says the CPU has no high-water
    mark."""
    import jax
    import numpy as np
    import peak_probe

    import client
    from client import zoo
    from workers.measure.compose import compose_stage
    from workers.measure.timing import random_array

    cfg = {"layers": 1, "hidden": 16, "heads": 2, "seq": 8, "batch": 2, "vocab": 32}
    built = zoo.make(
        "gpt", num_layers=1, hidden_size=16, num_heads=2, seq_len=8, vocab_size=32, batch_size=2
    )
    spec = client.trace(built.loss_fn, built.params, built.batch, name="gpt")
    for start, end in ((1, 1), (0, 2)):
        program = compose_stage(spec, start, end)
        params = [random_array(jax.ShapeDtypeStruct(p.shape, p.dtype), i) for i, p in
                  enumerate(program.params)]  # fmt: skip
        inputs = [
            random_array(jax.ShapeDtypeStruct(v.shape, v.dtype), 1000 + i)
            for i, v in enumerate(program.inputs)
        ]
        ours = jax.jit(program.fn)(params, inputs)[0]
        fn = gpu_check.direct_function(built, cfg, start, end)
        named = {p.name: a for p, a in zip(program.params, params, strict=True)}
        direct = jax.jit(fn)(named, *inputs)
        np.testing.assert_allclose(np.asarray(ours), np.asarray(direct), rtol=1e-5, atol=1e-6)

    probe = peak_probe.probe_peak(spec, 1, 1)
    assert set(probe) == set(peak_probe.PROBE_KEYS)
    assert probe["device_peak_bytes"] is None
    assert "memory_stats() is None" in probe["device_peak_unavailable"]


def test_imports_without_blocked_modules() -> None:
    """What the check imports loads in a process where BLOCKED cannot be imported."""
    code = BLOCKER + (
        "import gpu_check, peak_probe, direct_vjp\n"
        "import client.tracing, client.zoo, schemas, programs, workers.measure\n"
        "import workers.measure.stage_modules, workers.measure.timing\n"
        "print(sys.modules['workers'].__file__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd="/",
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert Path(proc.stdout.strip()).resolve() == ROOT / "workers" / "__init__.py"


@pytest.mark.slow
def test_small_run_on_cpu(tmp_path: Path) -> None:
    """--small on the CPU, with BLOCKED unimportable: every figure of every stage is in the
    JSON, the CPU's high-water mark is reported unavailable (not faked), the figures agree
    with the direct step where they must, and --json-out holds the same object."""
    out_path = tmp_path / "gpu_check.json"
    code = BLOCKER + (
        "import runpy\n"
        f"sys.argv = [{str(BENCH / 'gpu_check.py')!r}, '--small', '--json-out', "
        f"{str(out_path)!r}]\n"
        f"runpy.run_path({str(BENCH / 'gpu_check.py')!r}, run_name='__main__')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd="/",
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    lines = proc.stdout.strip().splitlines()
    out = json.loads(lines[-1])
    assert json.loads(out_path.read_text()) == out
    assert "GPU check on cpu (cpu)" in proc.stdout and "unavailable" in proc.stdout
    assert out["device"]["platform"] == "cpu" and out["device"]["memory_stats"] is False
    assert Path(out["project_from"]) == ROOT
    assert out["all_ok"] is True
    assert [(s["stage"], s["start"], s["end"]) for s in out["stages"]] == gpu_check.stages(4)
    for s in out["stages"]:
        assert set(gpu_check.ROW_KEYS) <= set(s), s["stage"]
        assert s["device_peak_bytes"] is None
        assert "memory_stats() is None" in s["device_peak_unavailable"]
        for key in (
            "predicted_peak_bytes",
            "stage_time_s",
            "direct_time_s",
            "intermediate_size",
            "direct_residual_bytes",
            "flops",
            "direct_flops",
            "compile_s",
            "direct_compile_s",
        ):
            assert isinstance(s[key], int | float) and s[key] > 0, (s["stage"], key)
        ratios = s["ratios"]
        # the stash is the direct VJP's residuals and the FLOPs its cost analysis, closely
        assert 0.85 <= ratios["intermediate_over_residuals"] <= 1.15, s["stage"]
        assert 0.95 <= ratios["flops_over_direct"] <= 1.05, s["stage"]
        assert ratios["peak_predicted_over_device"] is None
