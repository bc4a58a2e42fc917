"""The persistent compilation cache in one process: a fresh process loads what an earlier one
compiled and counts it; off, it compiles again. Each run is its own process (jax fixes its
cache at the first compile of a process)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from schemas import StageProfileResult
from tests.support.profiles import fake_profile
from workers.cluster.host_group import combine

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import json, jax, jax.numpy as jnp
from workers.measure.compile_cache import counting_cache_hits, enable_compile_cache
where = enable_compile_cache()
assert enable_compile_cache("/elsewhere") == where  # the first call decided
x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
with counting_cache_hits() as hits:
    jax.jit(lambda a: jnp.tanh(a) @ a.T).lower(x).compile()
with counting_cache_hits() as none:
    pass
print(json.dumps({"dir": where, "hits": hits.count, "hit": hits.hit, "none": none.count}))
"""


def _compile_once(setting: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env |= {"STAGEPROF_COMPILE_CACHE_DIR": setting, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_fresh_process_loads_what_an_earlier_one_compiled(tmp_path: Path) -> None:
    cache = tmp_path / "xla"
    first = _compile_once(str(cache))
    assert first == {"dir": str(cache), "hits": 0, "hit": False, "none": 0}
    assert any(cache.iterdir())
    second = _compile_once(str(cache))
    assert second == {"dir": str(cache), "hits": 1, "hit": True, "none": 0}


def test_off_compiles_again() -> None:
    assert (
        _compile_once("off")
        == _compile_once("off")
        == {
            "dir": None,
            "hits": 0,
            "hit": False,
            "none": 0,
        }
    )


def _rank(process: str, forward_s: float, hits: tuple[bool, bool]) -> StageProfileResult:
    """One rank's result: forward and backward, each loaded from the cache or not."""
    result = fake_profile("fp", forward=forward_s, backward=0.01)
    modules = tuple(
        m.model_copy(update={"compile_cache_hit": hit})
        for m, hit in zip(result.module_profile_results, hits, strict=True)
    )
    return result.model_copy(
        update={
            "module_profile_results": modules,
            "compile_cache_hits": sum(hits),
            "measured_by": (process,),
        }
    )


def test_a_group_loaded_a_module_only_if_every_rank_did() -> None:
    # rank 0 loaded both modules, rank 1 (slower forward) only the backward
    both = combine([_rank("a:1", 0.01, (True, True)), _rank("b:2", 0.02, (False, True))])
    assert [m.compile_cache_hit for m in both.module_profile_results] == [False, True]
    assert both.compile_cache_hits == 1 and both.measured_by == ("a:1", "b:2")
    assert both.module_profile_results[0].compute_cost == 0.02  # the slowest rank's time
    alone = combine([_rank("a:1", 0.01, (True, False))])
    assert alone.compile_cache_hits == 1
