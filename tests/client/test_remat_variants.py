"""Remat variants of a layer: the pair exported under `full` and `dots`, checked against
`jax.vjp` / `jax.checkpoint` of the un-exported block."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import client
import programs
from programs import load_program
from schemas import REMAT_CHOICES, ModelSpec, PlanOptions, ShardingConfig, SubmeshShape
from tests.client.helpers import assert_roundtrip
from workers.measure import compose_stage
from workers.measure.fingerprint import stage_fingerprint

H, N = 64, 16


def block(p: dict, x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ p["w1"])
    return x + jnp.sin(h) @ p["w2"]


def make_params(key: jax.Array) -> dict:
    k = jax.random.split(key, 6)
    return {
        f"b{i}": {
            "w1": jax.random.normal(k[2 * i], (H, 4 * H)) / 8,
            "w2": jax.random.normal(k[2 * i + 1], (4 * H, H)) / 16,
        }
        for i in range(3)
    }


def loss(p: dict, batch: dict, wrap=lambda f: f) -> jax.Array:
    x = batch["x"]
    for i in range(3):
        with client.layer(f"b{i}"):
            x = wrap(block)(p[f"b{i}"], x)
    with client.layer("head"):
        return jnp.mean(x**2)


PARAMS = make_params(jax.random.key(0))
BATCH = {"x": jax.random.normal(jax.random.key(1), (N, H))}


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return client.trace(loss, PARAMS, BATCH)


@pytest.fixture(scope="module")
def plain() -> ModelSpec:
    return client.trace(loss, PARAMS, BATCH, remat_variants=())


def _stash(layer) -> int:
    own = {v.name: v for v in [*layer.inputs, *layer.outputs]}
    return sum(r.size_bytes for r in layer.residuals) + sum(own[n].size_bytes for n in layer.saved)


def _cost(fn, *args) -> float:
    return float(jax.jit(fn).lower(*args).compile().cost_analysis()["flops"])


def test_as_written_is_todays_pair_and_identical_blocks_share_variants(spec, plain) -> None:
    for layer, old in zip(spec.layers, plain.layers, strict=True):
        assert (layer.forward, layer.backward, layer.fingerprint) == (
            old.forward,
            old.backward,
            old.fingerprint,
        )
        assert old.remat_variants == {}
    b0, b1 = spec.layers[1], spec.layers[2]
    assert set(b0.remat_variants) == {"full", "dots"}
    for name in ("full", "dots"):
        assert b0.remat_variants[name].forward is b1.remat_variants[name].forward
        assert b0.remat_variants[name].fingerprint == b1.remat_variants[name].fingerprint
    fps = {b0.fingerprint, *(v.fingerprint for v in b0.remat_variants.values())}
    assert len(fps) == 3
    assert b0.program_chars > plain.layers[1].program_chars


def test_full_stash_is_the_inputs_its_backward_reads(spec) -> None:
    full = spec.layers[1].variant("full")
    assert full.residuals == []
    assert full.saved == [spec.layers[1].inputs[0].name] == ["b0:0"]
    # Reference: what jax.vjp keeps of the checkpointed block, besides its parameters.
    ckpt = jax.checkpoint(block, policy=jax.checkpoint_policies.nothing_saveable)
    _, vjp = jax.vjp(ckpt, PARAMS["b1"], BATCH["x"])
    param_ids = {id(a) for a in jax.tree_util.tree_leaves(PARAMS["b1"])}
    kept = {id(a): a for a in jax.tree_util.tree_leaves(vjp) if id(a) not in param_ids}
    assert _stash(full) == sum(a.nbytes for a in kept.values()) == BATCH["x"].nbytes
    assert _stash(full) < _stash(spec.layers[1].variant("dots")) < _stash(spec.layers[1])


def test_full_backward_flops_are_forward_plus_backward(spec) -> None:
    layer = spec.layers[1]
    full = layer.variant("full")
    p, x = PARAMS["b1"], BATCH["x"]
    ct = jnp.ones_like(x)
    exp = load_program(full.backward)
    args = [p["w1"], p["w2"], x, ct]
    assert [tuple(a.shape) for a in exp.in_avals] == [tuple(a.shape) for a in args]
    exported = _cost(exp.call, *args)
    reference = _cost(lambda p, x, ct: jax.vjp(block, p, x)[1](ct), p, x, ct)
    assert exported == pytest.approx(reference, rel=0.02)
    plain_bwd = _cost(load_program(layer.backward).call, *_plain_args(layer, p, x, ct))
    assert exported > plain_bwd * 1.2
    assert full.backward_flops > layer.backward_flops


def _plain_args(layer, p, x, ct) -> list:
    outs = load_program(layer.forward).call(p["w1"], p["w2"], x)
    env = {layer.inputs[0].name: x, layer.outputs[0].name: outs[0]}
    return [p["w1"], p["w2"], *(env[n] for n in layer.saved), *outs[1:], ct]


def test_variants_compute_the_same_gradients(spec) -> None:
    layer, p, x = spec.layers[1], PARAMS["b1"], BATCH["x"]
    ct = jnp.cos(x)
    want = jax.vjp(block, p, x)[1](ct)
    for name in ("as_written", "full", "dots"):
        form = layer.variant(name)
        outs = load_program(form.forward).call(p["w1"], p["w2"], x)
        env = {form.inputs[0].name: x, form.outputs[0].name: outs[0]}
        args = [p["w1"], p["w2"], *(env[n] for n in form.saved), *outs[1:], ct]
        got = load_program(form.backward).call(*args)
        np.testing.assert_allclose(got[0], want[0]["w1"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[2], want[1], rtol=1e-4, atol=1e-5)


def test_a_checkpointed_model_keeps_what_it_wrote() -> None:
    def ckpt_loss(p, batch):
        return loss(p, batch, wrap=jax.checkpoint)

    spec = client.trace(ckpt_loss, PARAMS, BATCH)
    plain = client.trace(ckpt_loss, PARAMS, BATCH, remat_variants=())
    b1 = spec.layers[1]
    assert (b1.forward, b1.fingerprint) == (plain.layers[1].forward, plain.layers[1].fingerprint)
    assert _stash(b1) == BATCH["x"].nbytes
    # `full` keeps no less than what the user wrote: left out.
    assert "full" not in b1.remat_variants


def test_server_checks_verify_variants(spec) -> None:
    assert programs.check_programs(spec) == []
    assert programs.fingerprint_problems(spec) == []
    layer = spec.layers[0]
    full = layer.remat_variants["full"]
    broken = full.model_copy(update={"backward": layer.backward})
    bad = _with_variant(spec, "full", broken)
    problems = [str(p) for p in programs.check_programs(bad)]
    assert problems and all(
        p.startswith("layers[0].remat_variants['full'].backward") for p in problems
    )
    wrong_fp = _with_variant(spec, "full", full.model_copy(update={"fingerprint": "0" * 64}))
    (problem,) = programs.fingerprint_problems(wrong_fp)
    assert str(problem).startswith("layers[0].remat_variants['full'].fingerprint")
    refreshed = programs.with_fingerprints(wrong_fp)
    assert refreshed.layers[0].remat_variants["full"].fingerprint == full.fingerprint


def test_bad_variants_are_refused(spec) -> None:
    data = spec.model_dump(mode="json")
    data["layers"][0]["remat_variants"]["sometimes"] = data["layers"][0]["remat_variants"]["full"]
    with pytest.raises(ValueError, match="unknown variant 'sometimes'"):
        ModelSpec.model_validate(data)
    with pytest.raises(ValueError, match="remat_variants: unknown"):
        client.trace(loss, PARAMS, BATCH, remat_variants=("everything",))


def _with_variant(spec: ModelSpec, name: str, variant) -> ModelSpec:
    layer = spec.layers[0]
    layer = layer.model_copy(update={"remat_variants": {**layer.remat_variants, name: variant}})
    return spec.model_copy(update={"layers": [layer, *spec.layers[1:]]})


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_stages_composed_under_a_variant_train_the_same(spec, remat) -> None:
    assert_roundtrip(spec.under_remat(remat), loss, PARAMS, BATCH, cuts=(2,))


def test_a_variant_stage_has_its_own_fingerprint_and_smaller_stash(spec) -> None:
    args = {
        "submesh": SubmeshShape(hosts=1, devices_per_host=1),
        "config": ShardingConfig(logical_mesh=(1, 1), strategy="data"),
        "device_kind": "cpu",
        "jax_version": jax.__version__,
        "options": PlanOptions(),
    }
    fps = {r: stage_fingerprint(spec.under_remat(r), 1, 2, **args) for r in REMAT_CHOICES}
    assert fps["as_written"] == stage_fingerprint(spec, 1, 2, **args)
    assert len(set(fps.values())) == 3
    stash = {
        r: sum(v.size_bytes for v in compose_stage(spec.under_remat(r), 1, 2).stash)
        for r in REMAT_CHOICES
    }
    assert stash["full"] == 2 * N * H * 4  # each block's input
    assert stash["full"] < stash["dots"] < stash["as_written"]
    with pytest.raises(ValueError, match="unknown variant 'most'"):
        spec.under_remat("most")
