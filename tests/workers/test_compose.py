"""workers.measure.compose: stages from layer programs; wiring, caching, numerics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import client
from tests.client.helpers import assert_roundtrip, by_name
from workers.measure.compose import compose_stage, load_layer

H = 8


def _loss(p: dict, b: dict[str, jax.Array]) -> jax.Array:
    """Four layers: d reads a's and c's outputs; the embedding `e` is tied into layer d."""
    with client.layer("a"):
        h1 = jnp.tanh(b["x"] @ p["e"])
    with client.layer("b"):
        h2 = jnp.tanh(h1 @ p["w1"])
    with client.layer("c"):
        h3 = jnp.tanh(h2 @ p["w2"])
    with client.layer("d"):
        return jnp.mean(((h3 + h1) @ p["e"].T - b["y"]) ** 2)


def _params() -> dict[str, jax.Array]:
    keys = jax.random.split(jax.random.key(0), 3)
    return {
        n: jax.random.normal(k, (H, H)) / 3 for n, k in zip(("e", "w1", "w2"), keys, strict=True)
    }


def _batch() -> dict[str, jax.Array]:
    kx, ky = jax.random.split(jax.random.key(1))
    return {"x": jax.random.normal(kx, (4, H)), "y": jax.random.normal(ky, (4, H))}


@pytest.fixture(scope="module")
def spec():
    return client.trace(_loss, _params(), _batch())


def test_stage_io(spec) -> None:
    a, b, c, d = spec.layers
    stage = compose_stage(spec, 1, 2)
    assert [p.name for p in stage.params] == ["w1", "w2"]
    assert [v.name for v in stage.inputs] == [a.outputs[0].name]
    assert [v.name for v in stage.outputs] == [c.outputs[0].name]
    first = compose_stage(spec, 0, 1)
    # a's output feeds b inside the stage and d after it: it is an output of the stage.
    assert [v.name for v in first.outputs] == [a.outputs[0].name, b.outputs[0].name]
    last = compose_stage(spec, 3, 3)
    assert [v.name for v in last.outputs] == [spec.loss]
    assert {v.name for v in last.inputs} == {a.outputs[0].name, c.outputs[0].name, "y"}
    assert [p.name for p in compose_stage(spec, 0, 3).params] == ["e", "w1", "w2"]
    with pytest.raises(ValueError, match="bad layer range"):
        compose_stage(spec, 2, 1)
    with pytest.raises(ValueError, match="bad layer range"):
        compose_stage(spec, 0, 4)


def test_stage_runs_and_matches_the_layers(spec) -> None:
    named, batch = by_name(_params()), _batch()
    stage = compose_stage(spec, 1, 2)
    h1 = jnp.tanh(batch["x"] @ named["e"])
    (h3,) = jax.jit(stage.fn)([named["w1"], named["w2"]], [h1])
    np.testing.assert_allclose(h3, jnp.tanh(jnp.tanh(h1 @ named["w1"]) @ named["w2"]), rtol=1e-6)


@pytest.mark.parametrize("cuts", [(), (1,), (2,), (1, 2, 3)])
def test_tied_parameter_and_skip_roundtrip(spec, cuts: tuple[int, ...]) -> None:
    assert [p.name for p in spec.layers[3].params] == ["e"]
    assert_roundtrip(spec, _loss, _params(), _batch(), cuts=cuts)


def test_load_layer_is_cached(spec) -> None:
    forward, backward = load_layer(spec.layers[0])
    again = load_layer(spec.layers[0].model_copy())
    assert again[0] is forward and again[1] is backward
    assert forward.nr_devices == backward.nr_devices == 1
