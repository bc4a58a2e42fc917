"""client.trace: layers by named scope and by clustering; wiring; round-trip numerics."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import client
from client.layers import scope_segments
from tests.client.helpers import assert_roundtrip

H = 8


def skip_params(key: jax.Array) -> dict[str, jax.Array]:
    k = jax.random.split(key, 3)
    return {
        "a": {"w": jax.random.normal(k[0], (H, H)) / 3},
        "b": {"w": jax.random.normal(k[1], (H, H)) / 3},
        "c": {"w": jax.random.normal(k[2], (H, H)) / 3, "bias": jnp.full((H,), 0.1)},
    }


def skip_loss(p: dict, batch: dict[str, jax.Array]) -> jax.Array:
    """Three layers; layer c reads layer a's output (a skip connection across layer b)."""
    with client.layer("a"):
        h1 = jnp.tanh(batch["x"] @ p["a"]["w"])
    with client.layer("b"):
        h2 = jax.nn.relu(h1 @ p["b"]["w"])
    with client.layer("c"):
        out = (h2 + h1) @ p["c"]["w"] + p["c"]["bias"]
        return jnp.mean((out - batch["y"]) ** 2)


def skip_batch(key: jax.Array, n: int = 4) -> dict[str, jax.Array]:
    kx, ky = jax.random.split(key)
    return {"x": jax.random.normal(kx, (n, H)), "y": jax.random.normal(ky, (n, H))}


@pytest.fixture(scope="module")
def skip_spec():
    return client.trace(skip_loss, skip_params(jax.random.key(0)), skip_batch(jax.random.key(1)))


def test_skip_connection_wiring(skip_spec) -> None:
    a, b, c = skip_spec.layers
    assert [layer.name for layer in skip_spec.layers] == ["a", "b", "c"]
    assert [v.name for v in skip_spec.inputs] == ["x", "y"]
    assert [v.name for v in a.inputs] == ["x"]
    assert [p.name for p in a.params] == ["a/w"]
    assert [p.name for p in c.params] == ["c/bias", "c/w"]
    h1 = a.outputs[0].name
    assert [v.name for v in b.inputs] == [h1]
    assert {v.name for v in c.inputs} == {h1, b.outputs[0].name, "y"}
    assert c.outputs[0].name == skip_spec.loss and c.outputs[0].shape == ()
    assert all(layer.flops > 0 for layer in skip_spec.layers)
    assert a.flops >= 2 * 4 * H * H


@pytest.mark.parametrize("cuts", [(), (1,), (2,), (1, 2)])
def test_skip_connection_roundtrip(skip_spec, cuts: tuple[int, ...]) -> None:
    params, batch = skip_params(jax.random.key(0)), skip_batch(jax.random.key(1))
    assert_roundtrip(skip_spec, skip_loss, params, batch, cuts=cuts)


def test_abstract_params_give_the_same_spec(skip_spec) -> None:
    abstract = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), skip_params(jax.random.key(0))
    )
    batch = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in skip_batch(jax.random.key(1)).items()
    }
    spec = client.trace(skip_loss, abstract, batch)
    assert [layer.fingerprint for layer in spec.layers] == [
        layer.fingerprint for layer in skip_spec.layers
    ]
    assert spec.model_dump(exclude={"layers"}) == skip_spec.model_dump(exclude={"layers"})


def nested_loss(p: dict, batch: dict[str, jax.Array]) -> jax.Array:
    """Nested calls (jit, custom_jvp, remat) inside layers, a closed-over constant, and
    unscoped equations at the end (they join the last layer)."""
    offset = np.linspace(-1.0, 1.0, H, dtype=np.float32)
    with client.layer("first"):
        h = jax.jit(lambda x, w: jnp.sin(x @ w))(batch["x"], p["w1"]) + offset
        h = jax.nn.relu(h)  # custom_jvp
    with client.layer("second"):
        h = jax.checkpoint(lambda x, w: jax.nn.gelu(x @ w))(h, p["w2"])
    return jnp.sum(h**2) / h.size


def test_nested_calls_constants_and_unscoped_equations() -> None:
    k1, k2 = jax.random.split(jax.random.key(2))
    params = {"w1": jax.random.normal(k1, (H, H)), "w2": jax.random.normal(k2, (H, H))}
    batch = {"x": jax.random.normal(jax.random.key(3), (4, H))}
    spec = client.trace(nested_loss, params, batch)
    assert [layer.name for layer in spec.layers] == ["first", "second"]
    assert "jit" in spec.layers[0].jaxpr and "custom_jvp_call" in spec.layers[0].jaxpr
    assert "remat" in spec.layers[1].jaxpr or "checkpoint" in spec.layers[1].jaxpr
    assert spec.layers[1].outputs[0].shape == ()
    assert_roundtrip(spec, nested_loss, params, batch)


def test_scope_that_comes_back_starts_a_new_layer() -> None:
    def loss(p: dict, batch: dict[str, jax.Array]) -> jax.Array:
        with client.layer("enc"):
            h = batch["x"] @ p["w"]
        with client.layer("mid"):
            h = jnp.tanh(h)
        with client.layer("enc"):  # the same weights again: a shared parameter
            h = h @ p["w"]
        return jnp.mean(h**2)

    params = {"w": jax.random.normal(jax.random.key(4), (H, H)) / 3}
    batch = {"x": jax.random.normal(jax.random.key(5), (4, H))}
    spec = client.trace(loss, params, batch)
    assert [layer.name for layer in spec.layers] == ["enc", "mid", "enc.1"]
    assert spec.layers[0].params == spec.layers[2].params
    assert_roundtrip(spec, loss, params, batch)
    assert_roundtrip(spec, loss, params, batch, cuts=(2,))


def test_unscoped_model_is_one_layer() -> None:
    spec = client.trace(
        lambda p, b: jnp.mean(b["x"] @ p), jnp.ones((H, 2)), {"x": jnp.ones((4, H))}
    )
    assert [layer.name for layer in spec.layers] == ["layer0"]
    assert [p.name for p in spec.layers[0].params] == ["param"]


def test_leading_unscoped_equations_join_the_first_layer() -> None:
    def loss(p: jax.Array, b: dict[str, jax.Array]) -> jax.Array:
        x = b["x"] * 2.0
        with client.layer("only"):
            return jnp.mean(x @ p)

    eqns = jax.make_jaxpr(loss)(jnp.ones((H, 2)), {"x": jnp.ones((4, H))}).jaxpr.eqns
    assert scope_segments(eqns) == [("only", 0, len(eqns))]


@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_clustering_by_flops(skip_spec, num_layers: int) -> None:
    params, batch = skip_params(jax.random.key(0)), skip_batch(jax.random.key(1))
    spec = client.trace(skip_loss, params, batch, layers=num_layers)
    assert spec.num_layers == num_layers
    assert [layer.name for layer in spec.layers] == [f"layer{i}" for i in range(num_layers)]
    total = sum(layer.flops for layer in spec.layers)
    assert total == pytest.approx(sum(layer.flops for layer in skip_spec.layers))
    assert max(layer.flops for layer in spec.layers) <= 3.0 * total / num_layers
    assert_roundtrip(spec, skip_loss, params, batch)


def test_clustering_balances_a_deep_mlp_and_cuts_on_the_thin_activations() -> None:
    def loss(p: list[jax.Array], b: dict[str, jax.Array]) -> jax.Array:
        h = b["x"]
        for w in p:
            h = jnp.tanh(h @ w)
        return jnp.mean(h)

    params = [jax.ShapeDtypeStruct((H, H), jnp.float32) for _ in range(8)]
    spec = client.trace(loss, params, {"x": jax.ShapeDtypeStruct((4, H), jnp.float32)}, layers=4)
    flops = [layer.flops for layer in spec.layers]
    assert max(flops) <= 1.1 * sum(flops) / 4 + 1
    assert [len(layer.params) for layer in spec.layers] == [2, 2, 2, 2]
    for layer in spec.layers[:-1]:
        assert [v.shape for v in layer.outputs] == [(4, H)]


def test_too_many_layers_is_a_clear_error(skip_spec) -> None:
    with pytest.raises(ValueError, match="into 500 layers"):
        client.trace(skip_loss, skip_params(jax.random.key(0)), skip_batch(jax.random.key(1)), 500)


def test_bad_inputs_are_rejected() -> None:
    w = jnp.ones((H, 2))
    with pytest.raises(ValueError, match="one scalar"):
        client.trace(lambda p, b: b["x"] @ p, w, {"x": jnp.ones((4, H))})
    with pytest.raises(ValueError, match="dict"):
        client.trace(lambda p, b: jnp.sum(b @ p), w, jnp.ones((4, H)))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a valid name"):
        client.trace(lambda p, b: jnp.sum(b["1x"] @ p), w, {"1x": jnp.ones((4, H))})
    with pytest.raises(ValueError, match="both named 'x'"):
        client.trace(lambda p, b: jnp.sum(b["x"] @ p["x"]), {"x": w}, {"x": jnp.ones((4, H))})
    with pytest.raises(ValueError, match="unknown parameters"):
        client.trace(
            lambda p, b: jnp.sum(b["x"] @ p),
            w,
            {"x": jnp.ones((4, H))},
            logical_axes={"nope": ("embed", "mlp")},
        )


def test_bool_crosses_a_layer_boundary() -> None:
    def loss(p: jax.Array, b: dict[str, jax.Array]) -> jax.Array:
        with client.layer("a"):
            mask = (b["x"] @ p) > 0
        with client.layer("b"):
            return jnp.mean(jnp.where(mask, b["x"] @ p, 0.0))

    params, batch = jax.random.normal(jax.random.key(6), (H, H)), {"x": jnp.ones((4, H))}
    spec = client.trace(loss, params, batch)
    assert spec.layers[0].outputs[0].dtype == "bool"
    assert_roundtrip(spec, loss, params, batch)


def test_unsupported_dtype_across_a_layer_boundary_is_a_clear_error() -> None:
    def loss(p: jax.Array, b: dict[str, jax.Array]) -> jax.Array:
        with client.layer("a"):
            z = (b["x"] @ p).astype(jnp.complex64)
        with client.layer("b"):
            return jnp.mean(jnp.abs(z))

    with pytest.raises(ValueError, match="complex64.*crosses a layer boundary"):
        client.trace(loss, jnp.ones((H, H)), {"x": jnp.ones((4, H))})


def test_logical_axes_are_attached() -> None:
    spec = client.trace(
        lambda p, b: jnp.mean(b["x"] @ p["w"]),
        {"w": jnp.ones((H, 2))},
        {"x": jnp.ones((4, H))},
        logical_axes={"w": ("embed", "mlp")},
    )
    assert spec.layers[0].params[0].logical_axes == ("embed", "mlp")


def test_import_client_does_not_import_jax() -> None:
    code = "import sys, client; assert 'jax' not in sys.modules; client.trace; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_a_jitted_loss_is_cut_into_its_scopes() -> None:
    @jax.jit
    def head(h: jax.Array, w: jax.Array) -> jax.Array:
        with client.layer("head"):
            return jnp.mean(h @ w)

    @jax.jit
    def loss(p: dict, b: dict[str, jax.Array]) -> jax.Array:
        with client.layer("body"):
            h = jax.jit(jnp.tanh)(b["x"] @ p["w"])  # a call inside a layer stays whole
        return head(h, p["w"]) + head(2 * h, p["w"])

    params = {"w": jax.random.normal(jax.random.key(7), (H, H)) / 3}
    batch = {"x": jax.random.normal(jax.random.key(8), (4, H))}
    spec = client.trace(loss, params, batch)
    assert [layer.name for layer in spec.layers] == ["body", "head"]
    assert "jit" in spec.layers[0].jaxpr
    assert_roundtrip(spec, loss, params, batch, cuts=(1,))
