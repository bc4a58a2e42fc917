"""A spec exported with a symbolic batch dimension (client.trace_symbolic_batch), stated at a
size k (programs.spec_at_batch), against the same model traced at k (client.trace): the same
FLOPs, stash, output shapes and loss values; stage fingerprints differ between sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from client import zoo
from client.symbolic_batch import NotBatchPolymorphic, trace_symbolic_batch
from client.tracing import trace
from programs import check_programs, spec_at_batch
from schemas import ModelSpec, PlanOptions, ShardingConfig, SubmeshShape
from workers.measure.compose import compose_stage, stage_stash
from workers.measure.fingerprint import stage_fingerprint

GPT = {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_len": 8, "vocab_size": 64}


def _traced(size: int, symbolic: bool, variants: tuple[str, ...] = ()) -> ModelSpec:
    built = zoo.make("gpt", batch_size=size, **GPT)
    how = trace_symbolic_batch if symbolic else trace
    return how(
        built.loss_fn,
        built.params,
        built.batch,
        logical_axes=built.logical_axes,
        remat_variants=variants,
    )


@pytest.fixture(scope="module")
def symbolic() -> ModelSpec:
    return _traced(2, symbolic=True, variants=("full",))


def _stash_bytes(spec: ModelSpec) -> list[int]:
    return [sum(v.size_bytes for v in stage_stash([layer])) for layer in spec.layers]


def test_programs_take_a_symbolic_batch_and_check_clean(symbolic: ModelSpec) -> None:
    assert symbolic.symbolic_batch is not None and symbolic.symbolic_batch.probe_size == 4
    assert check_programs(symbolic) == []
    from programs import load_program

    dims = [str(a.shape[0]) for a in load_program(symbolic.layers[1].forward).in_avals[-1:]]
    assert dims == ["b"]


@pytest.mark.parametrize("size", [6])
def test_a_symbolic_spec_at_k_equals_the_spec_traced_at_k(symbolic: ModelSpec, size: int) -> None:
    at_k = spec_at_batch(symbolic, size)
    ref = _traced(size, symbolic=False, variants=("full",))
    assert at_k.micro_batch_size == ref.micro_batch_size == size
    for ours, theirs in zip(at_k.layers, ref.layers, strict=True):
        assert ours.name == theirs.name
        assert ours.flops == theirs.flops
        assert ours.backward_flops == theirs.backward_flops
        assert [v.shape for v in ours.outputs] == [v.shape for v in theirs.outputs]
        assert [(v.shape, v.dtype) for v in ours.residuals] == [
            (v.shape, v.dtype) for v in theirs.residuals
        ]
        assert ours.saved == theirs.saved
        for name, variant in ours.remat_variants.items():
            other = theirs.remat_variants[name]
            assert variant.backward_flops == other.backward_flops
            assert [v.shape for v in variant.residuals] == [v.shape for v in other.residuals]
    assert _stash_bytes(at_k) == _stash_bytes(ref)
    assert check_programs(at_k) == []

    built = zoo.make("gpt", batch_size=size, **GPT)
    params = zoo.init_params(built.params, jax.random.key(0))
    batch = built.sample_batch(jax.random.key(1))
    losses = []
    for spec in (at_k, ref):
        stage = compose_stage(spec, 0, spec.num_layers - 1)
        env = {**dict(_flat_params(params, spec)), **batch}
        values = [env[p.name] for p in stage.params]
        inputs = [env[v.name] for v in stage.inputs]
        (loss,) = jax.jit(stage.fn)(values, inputs)
        losses.append(float(loss))
    expected = float(built.loss_fn(params, batch))
    assert losses[0] == pytest.approx(expected, rel=1e-5)
    assert losses[1] == pytest.approx(expected, rel=1e-5)


def _flat_params(params: object, spec: ModelSpec) -> list[tuple[str, jax.Array]]:
    """The spec's parameters by name, from the model's pytree (names are key paths)."""
    from client.tracing import path_name

    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    by_name = {path_name(p): v for p, v in leaves}
    return [(p.name, by_name[p.name]) for layer in spec.layers for p in layer.params]


def test_stage_fingerprints_differ_between_sizes(symbolic: ModelSpec) -> None:
    options = PlanOptions()
    one = SubmeshShape(hosts=1, devices_per_host=1)
    config = ShardingConfig(logical_mesh=(1, 1), strategy="data")
    fps = {
        size: stage_fingerprint(
            spec_at_batch(symbolic, size), 1, 1, one, config, "cpu", "x", options
        )
        for size in (2, 4, 6)
    }
    assert len(set(fps.values())) == 3


def test_only_the_variants_asked_for_are_stated_and_fingerprints_do_not_change(
    symbolic: ModelSpec,
) -> None:
    every = spec_at_batch(symbolic, 6)
    plain = spec_at_batch(symbolic, 6, variants=["as_written"])
    kept = spec_at_batch(symbolic, 6, variants=["as_written", "full"])
    assert any(x.remat_variants for x in every.layers)
    assert not any(x.remat_variants for x in plain.layers)
    assert [x.remat_variants for x in kept.layers] == [x.remat_variants for x in every.layers]
    assert [x.fingerprint for x in plain.layers] == [x.fingerprint for x in every.layers]
    one = SubmeshShape(hosts=1, devices_per_host=1)
    config = ShardingConfig(logical_mesh=(1, 1), strategy="data")
    fps = {
        stage_fingerprint(spec, 0, 2, one, config, "cpu", "x", PlanOptions())
        for spec in (every, plain)
    }
    assert len(fps) == 1
    assert check_programs(plain) == []


def test_a_size_the_model_refuses_and_a_spec_without_symbolic_batch() -> None:
    plain = _traced(2, symbolic=False)
    assert spec_at_batch(plain, 2) is plain
    with pytest.raises(ValueError, match="without a symbolic batch dimension"):
        spec_at_batch(plain, 4)


def test_a_model_not_affine_in_the_batch_is_refused_with_the_reason() -> None:
    def loss(p: dict, batch: dict) -> jax.Array:
        x = batch["x"] @ p["w"]
        # 1 / batch as a float constant: not a·batch + c, so no symbolic export
        return jnp.sum(x * x) * (1.0 / batch["x"].shape[0])

    params = {"w": jax.ShapeDtypeStruct((4, 4), jnp.float32)}
    batch = {"x": jax.ShapeDtypeStruct((2, 4), jnp.float32)}
    with pytest.raises(NotBatchPolymorphic, match="not an integer a·batch"):
        trace_symbolic_batch(loss, params, batch, remat_variants=())
    assert np.isfinite(trace(loss, params, batch, remat_variants=()).layers[0].flops)
