"""workers.measure.compose_scan: a stage's runs of identical layers as `lax.scan`s give the
unrolled stage's outputs, gradients, stash and FLOPs, on 1 and 2 virtual devices."""

import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import client
from schemas import ModelSpec, ShardingConfig, SubmeshShape
from schemas.settings import env_settings
from tests.support.models import FAST_OPTIONS, tiny_gpt
from workers.measure.compose import compose_stage
from workers.measure.compose_scan import ScanStageProgram, compose_scan_stage
from workers.measure.fingerprint import SCAN_RUNS_KEY, stage_fingerprint_doc
from workers.measure.scan_modules import ScanStageModules
from workers.measure.scan_runs import Run, find_runs
from workers.measure.sharding import make_mesh, stage_shardings
from workers.measure.stage_modules import StageModules
from workers.measure.timing import random_array

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = 3


def _maxtext_spec(layers: int) -> ModelSpec:
    """examples/maxtext_decoder.py's `nn.scan`ned decoder, traced (client.scan unstacks it)."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        path = ROOT / "examples" / "maxtext_decoder.py"
        module_spec = importlib.util.spec_from_file_location("maxtext_decoder_example", path)
        assert module_spec is not None and module_spec.loader is not None
        example = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(example)
    finally:
        sys.path.remove(str(ROOT / "examples"))
    loss_fn, params, axes, batch = example.build(layers, 32)
    return client.trace(loss_fn, params, batch, name="maxtext", logical_axes=axes)


@pytest.fixture(scope="module")
def gpt() -> ModelSpec:
    return tiny_gpt(BLOCKS)


@pytest.fixture(scope="module")
def maxtext() -> ModelSpec:
    return _maxtext_spec(BLOCKS)


def _config(devices: int) -> ShardingConfig:
    return ShardingConfig(logical_mesh=(devices, 1), strategy="data")


def test_runs_of_the_tiny_gpt_and_the_maxtext_decoder(gpt: ModelSpec, maxtext: ModelSpec) -> None:
    whole = gpt.num_layers - 1  # embed, blocks 1..3, head
    assert find_runs(gpt, 0, whole, _config(1)) == [Run(1, BLOCKS, ((0, 0),), ())]
    assert find_runs(gpt, 2, 3, _config(1)) == [Run(2, 2, ((0, 0),), ())]
    assert find_runs(gpt, 1, 1, _config(1)) == []  # one layer is no run
    assert find_runs(gpt, 0, 1, _config(1)) == []  # embed and a block differ
    # the decoder layers read their input (stacked) and the broadcast positions (once)
    (run,) = find_runs(maxtext, 0, maxtext.num_layers - 1, _config(1))
    assert (run.first, run.length, run.carry) == (1, BLOCKS, ((0, 0),))
    assert run.saved == (("in", 0), ("bcast", 1))


def _chain_loss(tied: bool):  # type: ignore[no-untyped-def]
    """Three identical tanh blocks; block 0's output also feeds the head (a skip)."""

    def loss(p: dict, b: dict[str, jax.Array]) -> jax.Array:
        h, first = b["x"], None
        for i in range(3):
            with client.layer(f"b{i}"):
                h = jnp.tanh(h @ p["w" if tied else f"w{i}"])
            first = h if first is None else first
        with client.layer("head"):
            return jnp.mean((h + first - b["y"]) ** 2)

    return loss


def _chain(tied: bool) -> ModelSpec:
    names = ["w"] if tied else ["w0", "w1", "w2"]
    params = {n: jnp.full((8, 8), 0.1) for n in names}
    batch = {"x": jnp.ones((4, 8)), "y": jnp.zeros((4, 8))}
    return client.trace(_chain_loss(tied), params, batch)


@pytest.fixture(scope="module")
def chain() -> ModelSpec:
    return _chain(tied=False)


def test_a_skip_a_shared_stash_or_a_shared_parameter_ends_a_run(chain: ModelSpec) -> None:
    # each block saves its input and its output (tanh's vjp): the scan stacks the inputs
    run = Run(1, 2, ((0, 0),), (("in", 0), ("out", 0)))
    assert find_runs(chain, 1, 3, _config(1)) == [run]
    assert run.out_from_next and run.stacks("in") and not run.stacks("out")
    # block 0's output feeds the head too (a skip): block 0 cannot start the run, and it
    # saves block 1's input, which the run would stash a second time: no run in 0..3
    assert find_runs(chain, 0, 3, _config(1)) == []
    assert compose_scan_stage(chain, 0, 3, _config(1)) is None
    tied = _chain(tied=True)  # one parameter for all blocks: nothing to stack
    assert find_runs(tied, 1, 3, _config(1)) == []


def _values(structs: list, seed: int) -> list[jax.Array]:
    return [random_array(s, seed + i) for i, s in enumerate(structs)]


def _run_modules(modules: StageModules, params: list, inputs: list) -> tuple:
    fwd, bwd = modules.compile_forward(), modules.compile_backward()
    outs, stash, aux = fwd.compiled(params, inputs)
    cot = tuple(jnp.ones_like(o) for o in outs)
    grads, input_grads = bwd.compiled(params, stash, cot)
    return outs, aux, grads, input_grads, sum(modules.stash_sizes), (fwd, bwd)


def _lowered_flops(modules: StageModules) -> tuple[float, float]:
    """FLOPs of the forward and backward in their HLO before XLA's passes (after
    `compile_forward`)."""
    fwd = jax.jit(modules._forward).lower(modules.param_structs, modules.input_structs)
    bwd = jax.jit(modules._backward).lower(
        modules.param_structs, tuple(modules.forward_out[1]), modules.cotangent_structs()
    )
    return fwd.cost_analysis()["flops"], bwd.cost_analysis()["flops"]


@pytest.mark.parametrize(
    ("model", "start", "end", "devices"),
    [
        ("gpt", 0, 4, 1),  # embed, the 3 blocks scanned, head
        ("gpt", 0, 4, 2),
        ("maxtext", 0, 4, 1),  # scanned model: positions broadcast, inputs saved
        ("maxtext", 0, 4, 2),
        ("gpt", 2, 3, 1),  # a run alone
        ("chain", 1, 3, 1),  # saved inputs and outputs
    ],
)
def test_scanned_stage_equals_the_unrolled_stage(
    request: pytest.FixtureRequest, model: str, start: int, end: int, devices: int
) -> None:
    spec: ModelSpec = request.getfixturevalue(model)
    config = _config(devices)
    mesh = make_mesh(jax.devices()[:devices], config)
    unrolled_program = compose_stage(spec, start, end)
    shardings = stage_shardings(mesh, config, unrolled_program.params, unrolled_program.inputs)
    unrolled = StageModules(unrolled_program, shardings, "adam")
    program = compose_scan_stage(spec, start, end, config)
    assert isinstance(program, ScanStageProgram)
    scanned = ScanStageModules(spec, program, shardings, "adam")
    # one run: its k layers' parameters are one stacked parameter per position
    (run,) = program.runs
    n_body = len(spec.layers[run.first].params)
    assert len(program.params) == len(unrolled_program.params) - (run.length - 1) * n_body
    assert [p.shape[0] for i, p in enumerate(program.params) if i in program.run_params[0]] == [
        run.length
    ] * n_body

    params = _values(unrolled.param_structs, 0)
    inputs = _values(unrolled.input_structs, 1000)
    stacked = [
        jax.device_put(v, s.sharding)
        for v, s in zip(program.stack(params), scanned.param_structs, strict=True)
    ]
    want = _run_modules(unrolled, params, inputs)
    got = _run_modules(scanned, stacked, inputs)
    for a, b in zip([*want[0], *want[1]], [*got[0], *got[1]], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    for a, b in zip([*want[2], *want[3]], [*program.unstack(got[2]), *got[3]], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    assert got[4] == want[4]  # the stash (intermediate_size), per device

    # FLOPs. Before XLA's passes, the scan's are the unrolled stage's minus (k - 1) layers,
    # plus the loop's index arithmetic (0 to 4 scalar FLOPs): what the correction adds back.
    body = [float(m.flops_uncounted) for m in got[5]]
    lowered_unrolled, lowered_scanned = _lowered_flops(unrolled), _lowered_flops(scanned)
    from programs import load_layer

    layer = spec.layers[run.first]
    fwd_layer, bwd_layer = load_layer(layer)
    assert all(b > 0 for b in body)
    per_layer = [
        jax.jit(fwd_layer.call).lower(*_structs(layer, "forward")).cost_analysis()["flops"],
        jax.jit(bwd_layer.call).lower(*_structs(layer, "backward")).cost_analysis()["flops"],
    ]
    for u, s, one in zip(lowered_unrolled, lowered_scanned, per_layer, strict=True):
        assert 0 <= s + (run.length - 1) * one - u <= 4
    # Compiled, the unrolled module's count includes what XLA's fusion duplicates across
    # layers (a few % for 3 tiny blocks): the measured FLOPs agree within 10%, never more.
    for m_u, m_s in zip(want[5], got[5], strict=True):
        flops_u = m_u.compiled.cost_analysis()["flops"]
        flops_s = m_s.compiled.cost_analysis()["flops"] + m_s.flops_uncounted
        assert abs(flops_s - flops_u) <= 0.10 * flops_u


def _structs(layer, which: str) -> list[jax.ShapeDtypeStruct]:  # type: ignore[no-untyped-def]
    def sds(vs: list) -> list[jax.ShapeDtypeStruct]:
        return [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in vs]

    if which == "forward":
        return sds(layer.params) + sds(layer.inputs)
    by_name = {v.name: v for v in [*layer.inputs, *layer.outputs]}
    floats = [v for v in layer.outputs if v.dtype.startswith(("float", "bfloat"))]
    return (
        sds(layer.params)
        + sds([by_name[n] for n in layer.saved])
        + sds(layer.residuals)
        + sds(floats)
    )


def test_the_fingerprint_names_the_scanned_composition(
    gpt: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = (SubmeshShape(hosts=1, devices_per_host=1), _config(1), "cpu", jax.__version__)
    whole = gpt.num_layers - 1
    monkeypatch.delenv("STAGEPROF_SCAN_STAGES", raising=False)
    assert not env_settings().scan_stages
    unrolled = stage_fingerprint_doc(gpt, 0, whole, *args, FAST_OPTIONS)
    assert SCAN_RUNS_KEY not in unrolled
    monkeypatch.setenv("STAGEPROF_SCAN_STAGES", "1")
    scanned = stage_fingerprint_doc(gpt, 0, whole, *args, FAST_OPTIONS)
    assert scanned == {**unrolled, SCAN_RUNS_KEY: [[1, BLOCKS]]}
    # a stage without a run, and a split backward (composed unrolled), keep their fingerprint
    monkeypatch.delenv("STAGEPROF_SCAN_STAGES")
    alone = stage_fingerprint_doc(gpt, 1, 1, *args, FAST_OPTIONS)
    split = stage_fingerprint_doc(gpt, 0, whole, *args, FAST_OPTIONS, split_backward=True)
    monkeypatch.setenv("STAGEPROF_SCAN_STAGES", "on")
    assert stage_fingerprint_doc(gpt, 1, 1, *args, FAST_OPTIONS) == alone
    assert stage_fingerprint_doc(gpt, 0, whole, *args, FAST_OPTIONS, split_backward=True) == split


def test_measuring_with_scan_stages_on(gpt: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """The measuring path scans the run when `STAGEPROF_SCAN_STAGES` is on: same stash and
    parameter bytes as unrolled, FLOPs within 10%, another fingerprint."""
    from schemas import ClusterSpec, ProfileStatus
    from workers.measure import measure_stage_on

    cluster = ClusterSpec(num_hosts=1, devices_per_host=1)
    args = (gpt, 0, gpt.num_layers - 1, SubmeshShape(hosts=1, devices_per_host=1), _config(1))
    results = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("STAGEPROF_SCAN_STAGES", flag)
        results[flag] = measure_stage_on(*args, cluster, FAST_OPTIONS)
    unrolled, scanned = results["0"], results["1"]
    assert unrolled.status == scanned.status == ProfileStatus.ok, scanned.error
    assert scanned.fingerprint != unrolled.fingerprint
    assert scanned.intermediate_size == unrolled.intermediate_size
    assert scanned.initial_var_size == unrolled.initial_var_size
    assert scanned.input_shardings == unrolled.input_shardings
    assert abs(scanned.flops - unrolled.flops) <= 0.10 * unrolled.flops
    names = [n for m in scanned.module_profile_results for n in m.invar_names]
    assert any(n.endswith(f"[:{BLOCKS}]") for n in names)  # stacked parameters


def test_the_scan_stages_setting_is_off_unless_on() -> None:
    assert not env_settings({}).scan_stages
    for value, on in [("1", True), ("On", True), ("yes", True), ("0", False), ("", False)]:
        assert env_settings({"STAGEPROF_SCAN_STAGES": value}).scan_stages is on


def test_actors_follow_the_runner_s_scan_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner fingerprints a stage as its actors measure it: they get its setting."""
    from workers.cluster.host_group import worker_env

    monkeypatch.setenv("STAGEPROF_SCAN_STAGES", "1")
    assert worker_env(2, use_gpus=False)["STAGEPROF_SCAN_STAGES"] == "1"
