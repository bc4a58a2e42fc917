"""measure_stage: every strategy on 1, 2, 4 and 8 virtual devices; sizes; failures as results."""

import base64
import math
import re
import statistics

import jax
import pytest

from schemas import (
    ClusterSpec,
    ModelSpec,
    ModuleKind,
    PlanOptions,
    ProfileStatus,
    ShardingConfig,
    StageKey,
    StageProfileResult,
    SubmeshShape,
    max_n_succ_stages,
)
from schemas.sharding import ShardingStrategy, fill_mesh_axes
from tests.workers.specs import dense_spec
from workers.measure import stage as measure_mod
from workers.measure.stage import TIMING_BUDGET_S, measure_stage, measure_stage_on

CLUSTER = ClusterSpec(num_hosts=1, devices_per_host=8)
FAST = PlanOptions(repeats=2, warmup=1, schedule="1f1b")  # no B/W split: three modules
MODULES = (ModuleKind.forward, ModuleKind.backward, ModuleKind.apply_grad)

# (devices, logical mesh, strategy): every strategy on 1, 2, 4 and 8 devices
CASES = [
    (1, (1, 1), "data"),
    (1, (1, 1), "megatron"),
    (1, (1, 1), "fsdp"),
    (2, (2, 1), "data"),
    (2, (1, 2), "megatron"),
    (2, (2, 1), "fsdp"),
    (4, (4, 1), "data"),
    (4, (2, 2), "megatron"),
    (4, (2, 2), "fsdp"),
    (8, (8, 1), "data"),
    (8, (2, 4), "megatron"),
    (8, (4, 2), "fsdp"),
]


@pytest.fixture(scope="module")
def mlp() -> ModelSpec:
    from client import zoo

    return zoo.build("mlp", preset="tiny")


@pytest.fixture(scope="module")
def gpt() -> ModelSpec:
    from client import zoo

    return zoo.build("gpt", num_layers=2, hidden_size=32, seq_len=8, vocab_size=64)


def measure(
    spec: ModelSpec,
    start: int,
    end: int,
    devices: int,
    mesh: tuple[int, int],
    strategy: str,
    cluster: ClusterSpec = CLUSTER,
    options: PlanOptions = FAST,
) -> StageProfileResult:
    return measure_stage_on(
        spec,
        start,
        end,
        SubmeshShape(hosts=1, devices_per_host=devices),
        ShardingConfig(logical_mesh=mesh, strategy=strategy),  # type: ignore[arg-type]
        cluster,
        options,
    )


def ways(spec_text: str, sizes: dict[str, int]) -> int:
    """How many ways a PartitionSpec (as text) splits an array on a mesh of axis `sizes`."""
    axes = re.findall(r"'(\w+)'", spec_text)
    return math.prod(sizes[a] for a in axes)


def check_consistent(r: StageProfileResult, spec: ModelSpec, start: int, end: int) -> None:
    """Invariants every ok result keeps."""
    assert r.status == ProfileStatus.ok, r.error
    assert r.error is None
    assert tuple(m.module for m in r.module_profile_results) == MODULES
    assert r.num_layers == end - start + 1
    assert r.available_memory == CLUSTER.device_memory_bytes
    assert r.device_kind == jax.devices()[0].device_kind
    assert r.jax_version == jax.__version__
    assert len(r.fingerprint) == 64
    mesh = r.config.axis_sizes
    full = {p.name: p.size_bytes for layer in spec.layers[start : end + 1] for p in layer.params}
    full |= {v.name: v.size_bytes for layer in spec.layers for v in [*layer.inputs]}
    full |= {v.name: v.size_bytes for v in spec.inputs}
    fwd, bwd, apply = r.module_profile_results
    assert set(r.input_shardings) == set(fwd.invar_names)
    for name, size in zip(fwd.invar_names, fwd.invar_sizes, strict=True):
        # a sharded size is the full size divided by the ways it is split
        assert size * ways(r.input_shardings[name], mesh) == full[name], name
    for m in r.module_profile_results:
        assert len(m.invar_names) == len(m.invar_sizes) == len(m.donated_invars)
        assert len(m.outvar_names) == len(m.outvar_sizes)
        n = len(m.compute_cost_samples_s)
        assert FAST.repeats <= n <= FAST.max_repeats
        # runs stop at the cap, at the target spread, or once they add up to the budget
        assert (
            n == FAST.max_repeats
            or m.compute_cost_spread <= FAST.target_spread
            or sum(m.compute_cost_samples_s) >= TIMING_BUDGET_S
        )
        assert m.compute_cost == pytest.approx(statistics.median(m.compute_cost_samples_s))
        assert m.compute_cost > 0
        assert m.compile_seconds > 0
        assert m.peak_memory >= sum(m.invar_sizes) - sum(
            s for s, d in zip(m.invar_sizes, m.donated_invars, strict=True) if d
        )
        assert m.available_memory == r.available_memory
        assert m.flops >= 0 and m.bytes_accessed > 0
    assert fwd.peak_memory >= sum(fwd.invar_sizes)
    assert bwd.peak_memory >= sum(bwd.invar_sizes)
    params = [p.name for p in spec.layers[0].params]  # any layer: names show up as grads
    assert all(f"grad:{n}" in bwd.outvar_names for n in params if start == 0)
    # apply_grad: params + optimizer state in, donated; the gradients are the acc-grad inputs
    n_state = len(apply.outvar_names)
    assert apply.donated_invars == (True,) * n_state + (False,) * (len(apply.invar_names) - n_state)
    assert r.initial_var_size == sum(apply.outvar_sizes)
    param_bytes = sum(
        s for n, s in zip(fwd.invar_names, fwd.invar_sizes, strict=True) if n in full and "/" in n
    )
    assert r.initial_var_size >= 3 * param_bytes  # adam: mu and nu per parameter
    residuals = [
        s for n, s in zip(fwd.outvar_names, fwd.outvar_sizes, strict=True) if n.startswith("stash:")
    ]
    assert r.intermediate_size == sum(residuals) > 0
    assert r.flops == pytest.approx(fwd.flops + bwd.flops)
    assert r.compile_seconds == pytest.approx(
        sum(m.compile_seconds for m in r.module_profile_results)
    )
    # apply_grad runs once per iteration, when no micro-batch is stashed: the 1F1B rule
    # weighs the stash against the forward/backward peak.
    assert r.max_n_succ_stages == max_n_succ_stages(
        r.available_memory,
        max(fwd.peak_memory, bwd.peak_memory),
        r.initial_var_size,
        r.intermediate_size,
    )
    moved = sum(bwd.collective_bytes.values())
    if r.submesh.num_devices == 1:
        assert moved == 0
    else:
        assert moved > 0  # gradients are reduced over "data" or activations over "model"


@pytest.mark.parametrize(("devices", "mesh", "strategy"), CASES)
def test_every_strategy_on_1_2_4_8_devices(
    mlp: ModelSpec, devices: int, mesh: tuple[int, int], strategy: str
) -> None:
    r = measure(mlp, 0, 1, devices, mesh, strategy)
    check_consistent(r, mlp, 0, 1)
    dp, tp = mesh
    shard = r.input_shardings
    if strategy == "data" or (strategy == "megatron" and tp == 1):
        assert all(shard[p.name] == "P()" for p in mlp.layers[0].params)
    if strategy == "megatron" and tp > 1:
        assert shard["layer0/w1"] == "P(None, 'tensor')"
        assert shard["layer0/w2"] == "P('tensor',)"
    if strategy == "fsdp" and dp > 1:
        assert "'fsdp'" in shard["layer0/w1"] and "'fsdp'" in shard["layer0/w2"]
    if dp > 1:
        assert shard["x"] == ("P('fsdp',)" if strategy == "fsdp" else "P('data',)")


@pytest.mark.parametrize(
    ("start", "end", "devices", "mesh", "strategy"),
    [(1, 2, 4, (2, 2), "megatron"), (0, 3, 8, (4, 2), "fsdp")],
)
def test_gpt_stages(
    gpt: ModelSpec, start: int, end: int, devices: int, mesh: tuple[int, int], strategy: str
) -> None:
    r = measure(gpt, start, end, devices, mesh, strategy)
    check_consistent(r, gpt, start, end)
    fwd, bwd, _ = r.module_profile_results
    if start > 0:  # an activation from an earlier stage gets its gradient back
        assert f"grad:{gpt.layers[start].inputs[0].name}" in bwd.outvar_names
    else:  # token ids are integers: no gradient, and never counted as activations
        assert not any(n.startswith("grad:tokens") for n in bwd.outvar_names)
        assert "tokens" in fwd.invar_names


def test_measure_stage_resolves_the_key_through_the_planner(mlp: ModelSpec) -> None:
    from planner import enumerate_candidates

    cluster = ClusterSpec(num_hosts=1, devices_per_host=2)
    space = enumerate_candidates(mlp, cluster, FAST)
    key = next(k for k in space.keys if (k.start, k.end) == (0, 1))
    submesh, config = space.resolve(key)
    r = measure_stage(mlp, key, cluster, FAST)
    assert r.ok, r.error
    assert (r.key, r.submesh, r.config) == (key, submesh, config)
    with pytest.raises(IndexError):
        measure_stage(mlp, StageKey(start=0, end=1, submesh_id=99, config_id=0), cluster, FAST)


# ----- failures are results ---------------------------------------------------------------


def test_oom_estimated_before_compiling(mlp: ModelSpec) -> None:
    tiny = ClusterSpec(num_hosts=1, devices_per_host=8, device_memory_bytes=1000)
    r = measure(mlp, 0, 1, 2, (2, 1), "data", cluster=tiny)
    assert r.status == ProfileStatus.oom
    assert r.estimate_bytes is not None and r.estimate_bytes > 1000
    assert "not compiled" in (r.error or "")
    assert r.module_profile_results == ()
    assert r.max_n_succ_stages == -1
    assert not r.ok and r.compute_cost == math.inf


def test_oom_predicted_from_the_compiled_peak(mlp: ModelSpec) -> None:
    ok = measure(mlp, 0, 1, 2, (2, 1), "data")
    assert ok.ok, ok.error
    # room for the parameters and optimizer state, but not for the modules' peak on top
    tight = ClusterSpec(
        num_hosts=1, devices_per_host=8, device_memory_bytes=ok.initial_var_size + 1
    )
    r = measure(mlp, 0, 1, 2, (2, 1), "data", cluster=tight)
    assert r.status == ProfileStatus.oom
    assert "predicted out of memory" in (r.error or "")
    assert r.estimate_bytes is None
    assert len(r.module_profile_results) == 3  # compiled, never run
    assert all(m.compute_cost_samples_s == () for m in r.module_profile_results)
    assert r.max_n_succ_stages == -1


def test_runtime_resource_exhausted_is_oom(mlp: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    def exhausted(*args: object) -> None:
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1 bytes")

    monkeypatch.setattr(measure_mod, "random_array", exhausted)
    r = measure(mlp, 0, 1, 2, (2, 1), "data")
    assert r.status == ProfileStatus.oom
    assert "RESOURCE_EXHAUSTED" in (r.error or "")


def test_runtime_error(mlp: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fails_for_inputs(struct: object, seed: int) -> jax.Array:
        calls.append(seed)
        if seed >= 1000:  # parameters allocate fine, the inputs do not
            raise RuntimeError("device went away")
        return real(struct, seed)

    real = measure_mod.random_array
    monkeypatch.setattr(measure_mod, "random_array", fails_for_inputs)
    r = measure(mlp, 0, 1, 2, (2, 1), "data")
    assert r.status == ProfileStatus.runtime_error
    assert "allocating inputs" in (r.error or "") and "device went away" in (r.error or "")
    assert len(r.module_profile_results) == 3


def test_timeout_from_a_tiny_limit(mlp: ModelSpec) -> None:
    r = measure(mlp, 0, 1, 2, (2, 1), "data", options=PlanOptions(candidate_timeout_s=1e-6))
    assert r.status == ProfileStatus.timeout
    assert "timed out in phase" in (r.error or "")
    assert r.max_n_succ_stages == -1


def test_compile_error_from_garbage_program() -> None:
    spec = dense_spec()
    broken = spec.layers[0].model_copy(
        update={"forward": base64.b64encode(b"not a jax export").decode()}
    )
    spec = spec.model_copy(update={"layers": [broken, *spec.layers[1:]]})
    r = measure(spec, 0, 1, 2, (2, 1), "data")
    assert r.status == ProfileStatus.compile_error
    assert "composing the stage" in (r.error or "")


def test_compile_error_from_declared_shapes_that_disagree() -> None:
    spec = dense_spec(hidden=16)
    layer = spec.layers[1]
    wrong = layer.inputs[0].model_copy(update={"shape": (8, 17)})
    layer = layer.model_copy(update={"inputs": [wrong]})
    spec = spec.model_copy(update={"layers": [spec.layers[0], layer, *spec.layers[2:]]})
    r = measure(spec, 1, 1, 2, (2, 1), "data")
    assert r.status == ProfileStatus.compile_error
    assert "compiling forward" in (r.error or "")


def test_too_few_devices_is_a_runtime_error(mlp: ModelSpec) -> None:
    r = measure_stage_on(
        mlp,
        0,
        1,
        SubmeshShape(hosts=1, devices_per_host=4),
        ShardingConfig(logical_mesh=(4, 1), strategy="data"),
        CLUSTER,
        FAST,
        devices=jax.devices()[:2],
    )
    assert r.status == ProfileStatus.runtime_error
    assert "needs 4 devices" in (r.error or "")


def test_logical_mesh_that_does_not_fit_the_submesh(mlp: ModelSpec) -> None:
    r = measure(mlp, 0, 1, 2, (4, 1), "data")
    assert r.status == ProfileStatus.compile_error
    assert "needs 4 devices, the submesh has 2" in (r.error or "")


def test_an_unexpected_error_is_still_a_result(
    mlp: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(measure_mod, "stage_shardings", broken)
    r = measure(mlp, 0, 1, 2, (2, 1), "data")
    assert r.status == ProfileStatus.runtime_error
    assert "KeyError" in (r.error or "")


def test_a_range_outside_the_model_is_a_result(mlp: ModelSpec) -> None:
    for start, end in [(1, 0), (0, 5)]:
        r = measure(mlp, start, end, 2, (2, 1), "data")
        assert r.status == ProfileStatus.compile_error
        assert "outside the model" in (r.error or "")


@pytest.mark.parametrize(
    ("sizes", "split"),
    [
        ({"context": 4}, "P(None, 'context')"),  # the sequence dim of the block's input
        ({"data": 2, "context": 2}, "P('data', 'context')"),
        ({"fsdp": 2, "tensor": 2}, "P('fsdp',)"),
    ],
)
def test_a_mesh_axes_config_measures_with_its_rules(
    gpt: ModelSpec, sizes: dict[str, int], split: str
) -> None:
    """A GPT block under MaxText's rules on a mesh-axes config: activations split on the
    batch and sequence rules, parameters by their logical axes, sizes consistent."""
    strategy = ShardingStrategy(name="maxtext", mesh_axes=sizes)
    config = ShardingConfig.from_strategy(strategy, fill_mesh_axes(sizes, 4))
    r = measure_stage_on(
        gpt, 1, 1, SubmeshShape(hosts=1, devices_per_host=4), config, CLUSTER, FAST
    )
    check_consistent(r, gpt, 1, 1)
    block_input = gpt.layers[1].inputs[0].name
    assert r.input_shardings[block_input] == split
    assert r.config.mesh_axes == fill_mesh_axes(sizes, 4)
    if sizes.get("tensor"):
        assert "'tensor'" in r.input_shardings["blocks/0/w1"]
