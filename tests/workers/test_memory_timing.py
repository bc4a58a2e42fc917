"""Memory accounting helpers and the timing loop."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from schemas import ParamSpec
from workers.measure.memory import estimate_initial_bytes, module_memory, per_device_bytes
from workers.measure.timing import CandidateTimeout, Deadline, median, random_array, time_runs


def mesh_2x2() -> Mesh:
    return Mesh(np.asarray(jax.devices()[:4]).reshape(2, 2), ("data", "model"))


def test_per_device_bytes_divides_by_the_split_ways() -> None:
    mesh = mesh_2x2()
    full = per_device_bytes((8, 16), "float32", None)
    assert full == 512
    assert per_device_bytes((8, 16), "float32", NamedSharding(mesh, PartitionSpec())) == 512
    assert per_device_bytes((8, 16), np.float32, NamedSharding(mesh, PartitionSpec("data"))) == 256
    both = NamedSharding(mesh, PartitionSpec("data", "model"))
    assert per_device_bytes((8, 16), "bfloat16", both) == 8 * 16 * 2 // 4


def test_estimate_initial_bytes_counts_adam_state() -> None:
    mesh = mesh_2x2()
    params = [ParamSpec(name="w", shape=(8, 16), dtype="float32")]
    split = [NamedSharding(mesh, PartitionSpec(None, "model"))]
    assert estimate_initial_bytes(params, split, "sgd") == 256
    assert estimate_initial_bytes(params, split, "adam") == 3 * 256


class FakeCompiled:
    def __init__(self, stats: object) -> None:
        self._stats = stats

    def memory_analysis(self) -> object:
        return self._stats


def test_module_memory_peak_falls_back_to_argument_output_alias_temp() -> None:
    stats = SimpleNamespace(
        argument_size_in_bytes=100,
        output_size_in_bytes=50,
        alias_size_in_bytes=20,
        temp_size_in_bytes=7,
        peak_memory_in_bytes=0,
    )
    mem = module_memory(FakeCompiled(stats))  # type: ignore[arg-type]
    assert (mem.peak, mem.temp) == (137, 7)
    # XLA's CPU peak_memory_in_bytes leaves temporaries out: on CPU the sum is the peak.
    stats.peak_memory_in_bytes = 130
    assert module_memory(FakeCompiled(stats)).peak == 137  # type: ignore[arg-type]
    # A GPU's heap-simulated peak is taken as it is.
    gpu = SimpleNamespace(platform="gpu")
    on_gpu = FakeCompiled(stats)
    on_gpu.input_shardings = ((SimpleNamespace(device_set=[gpu]),), {})  # type: ignore[attr-defined]
    assert module_memory(on_gpu).peak == 130  # type: ignore[arg-type]
    assert module_memory(FakeCompiled(None)).peak == 0  # type: ignore[arg-type]


def test_module_memory_of_a_real_module() -> None:
    x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    mem = module_memory(jax.jit(lambda a: a @ a + 1).lower(x).compile())
    assert mem.argument == 64 * 64 * 4
    assert mem.peak >= mem.argument + mem.output - mem.alias


def test_deadline_raises_with_the_phase() -> None:
    now = [0.0]
    deadline = Deadline(1.0, clock=lambda: now[0])
    deadline.check("compose")
    now[0] = 1.5
    with pytest.raises(CandidateTimeout, match="phase 'compile forward' after 1.500 s"):
        deadline.check("compile forward")


def test_time_runs_counts_warmup_and_repeats() -> None:
    calls = []

    def run() -> jax.Array:
        calls.append(1)
        return jnp.ones(4) * len(calls)

    samples, out = time_runs(run, warmup=2, repeats=3, deadline=Deadline(60), phase="forward")
    assert len(calls) == 5 and len(samples) == 3
    assert all(s >= 0 for s in samples)
    assert float(out[0]) == 5.0
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([]) == 0.0


def test_time_runs_stops_at_the_deadline() -> None:
    with pytest.raises(CandidateTimeout, match="forward warm-up"):
        time_runs(lambda: jnp.ones(2), 1, 5, Deadline(1e-9), "forward")


def test_random_array_is_sharded_and_valid_for_ints() -> None:
    mesh = mesh_2x2()
    sh = NamedSharding(mesh, PartitionSpec("data"))
    x = random_array(jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=sh), 0)
    ids = random_array(jax.ShapeDtypeStruct((8,), jnp.int32, sharding=sh), 1)
    assert x.sharding == sh and x.dtype == jnp.float32 and float(jnp.abs(x).max()) > 0
    assert ids.dtype == jnp.int32 and int(ids.max()) == 0
