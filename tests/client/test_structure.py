"""Layers from the computation's structure (issue 36): plain-JAX models with no markers whose
blocks are of two kinds, take turns, skip a block with a residual, or have zero-FLOP glue
between them; the same function traced before and after a `jax.jit` of it; `layers=N`
grouping whole blocks. Each checks the blocks found, one fingerprint per kind of block, and
that the chained forward/backward programs equal `jax.value_and_grad` of the loss."""

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import client
from schemas import ModelSpec
from tests.client.helpers import assert_roundtrip

B, T, H, V = 2, 8, 16, 40  # batch, sequence, hidden, vocabulary


def _w(key: jax.Array, *shape: int) -> jax.Array:
    return jax.random.normal(key, shape) / np.sqrt(shape[0])


def _batch() -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(jax.random.key(9))
    return {"x": jax.random.randint(k1, (B, T), 0, V), "y": jax.random.randint(k2, (B, T), 0, V)}


def _norm(x: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)


def _attend(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    q, k, v = (_norm(x) @ p[n] for n in ("q", "k", "v"))
    mask = jnp.tril(jnp.ones((T, T), bool))
    s = jnp.where(mask, jnp.einsum("btd,bsd->bts", q, k) / np.sqrt(H), -1e9)
    return x + jax.nn.softmax(s) @ v


def _mlp(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    return x + jax.nn.gelu(_norm(x) @ p["up"]) @ p["down"]


def _dense_params(key: jax.Array, width: int) -> dict[str, jax.Array]:
    k = jax.random.split(key, 5)
    return {
        "q": _w(k[0], H, H),
        "k": _w(k[1], H, H),
        "v": _w(k[2], H, H),
        "up": _w(k[3], H, width),
        "down": _w(k[4], width, H),
    }


def _moe_params(key: jax.Array) -> dict[str, jax.Array]:
    k = jax.random.split(key, 4)
    return {
        **_dense_params(k[0], 2 * H),
        "router": _w(k[1], H, 2),
        "up2": _w(k[2], H, 3 * H),
        "down2": _w(k[3], 3 * H, H),
    }


def dense_block(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    return _mlp(_attend(x, p), p)


def moe_block(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    """Attention, then two experts of different widths mixed by a router."""
    x = _attend(x, p)
    y = _norm(x)
    gate = jax.nn.softmax(y @ p["router"])
    a = jax.nn.gelu(y @ p["up"]) @ p["down"]
    b = jax.nn.relu(y @ p["up2"]) @ p["down2"]
    return x + gate[..., :1] * a + gate[..., 1:] * b


def _model(kinds: list[str], seed: int = 0) -> tuple[dict, Callable]:
    """Params and the loss of an LM whose blocks are `kinds` ("dense", "wide", "moe") in
    order; no scopes anywhere."""
    keys = jax.random.split(jax.random.key(seed), len(kinds) + 2)
    make = {
        "dense": lambda k: _dense_params(k, 2 * H),
        "wide": lambda k: _dense_params(k, 4 * H),
        "moe": _moe_params,
    }
    params = {
        "embed": _w(keys[0], V, H),
        "blocks": [make[kind](k) for kind, k in zip(kinds, keys[2:], strict=True)],
        "head": _w(keys[1], H, V),
    }
    run = {"dense": dense_block, "wide": dense_block, "moe": moe_block}

    def loss(p: dict, b: dict[str, jax.Array]) -> jax.Array:
        x = p["embed"][b["x"]]
        for kind, bp in zip(kinds, p["blocks"], strict=True):
            x = run[kind](x, bp)
        logits = _norm(x) @ p["head"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), b["y"][..., None], -1))

    return params, loss


def _trace(loss: Callable, params: Any, **kw: Any) -> ModelSpec:
    return client.trace(loss, params, _batch(), remat_variants=(), **kw)


def _fingerprints(spec: ModelSpec) -> list[str]:
    return [layer.fingerprint for layer in spec.layers]


def _assert_kinds(spec: ModelSpec, kinds: list[str]) -> None:
    """pre, one layer per block (equal kinds: equal fingerprints, different: different), post."""
    names = [layer.name for layer in spec.layers]
    assert spec.num_layers == len(kinds) + 2, names
    fps = _fingerprints(spec)[1:-1]
    for i, ki in enumerate(kinds):
        for j, kj in enumerate(kinds):
            assert (fps[i] == fps[j]) == (ki == kj), (names, kinds)
    assert all(layer.flops > 0 for layer in spec.layers[1:]), names
    assert any(V in p.shape for p in spec.layers[0].params), names
    assert any(V in p.shape for p in spec.layers[-1].params), names
    for layer in spec.layers[1:-1]:
        assert not any(V in p.shape for p in layer.params), names


@pytest.mark.parametrize(
    "kinds",
    [
        ["dense"] * 3 + ["wide"] * 2,  # two stacks of different blocks (encoder, decoder)
        ["dense", "moe"] * 3,  # a period of two: dense and MoE blocks taking turns
        ["dense", "dense", "moe"] * 2,  # a period of three
    ],
    ids=["two-stacks", "period-two", "period-three"],
)
def test_blocks_of_several_kinds(kinds: list[str]) -> None:
    params, loss = _model(kinds)
    spec = _trace(loss, params)
    _assert_kinds(spec, kinds)
    assert_roundtrip(spec, loss, params, _batch(), cuts=(1, len(kinds) // 2 + 1, len(kinds) + 1))


def test_a_residual_that_skips_a_block() -> None:
    """Each block adds the output of the block two back: blocks read two earlier layers."""
    params, _ = _model(["dense"] * 4)

    def loss(p: dict, b: dict[str, jax.Array]) -> jax.Array:
        x = p["embed"][b["x"]]
        prev = 0.5 * x
        for bp in p["blocks"]:
            prev, x = x, dense_block(x, bp) + prev
        return jnp.mean((_norm(x) @ p["head"]) ** 2)

    spec = _trace(loss, params)
    _assert_kinds(spec, ["dense"] * 4)
    assert len(spec.layers[2].inputs) == 2  # its block's input and the one before
    assert_roundtrip(spec, loss, params, _batch(), cuts=(2, 3, 5))


def test_zero_flop_glue_between_blocks() -> None:
    """A slice of a mask table at each block's own index (as BERT's `head_mask[i]`) and a
    reshape round trip between two of the blocks: no zero-FLOP layer, four blocks, and the
    blocks that read only their slice one fingerprint."""
    params, _ = _model(["dense"] * 4)

    def loss(p: dict, b: dict[str, jax.Array]) -> jax.Array:
        x = p["embed"][b["x"]]
        scales = jnp.ones((4, H))
        for i, bp in enumerate(p["blocks"]):
            x = dense_block(x * scales[i], bp)
            if i == 1:
                x = x.reshape(B * T, H).reshape(B, T, H)
        return jnp.mean((_norm(x) @ p["head"]) ** 2)

    spec = _trace(loss, params)
    names = [layer.name for layer in spec.layers]
    assert spec.num_layers == 6, names
    assert all(layer.flops > 0 for layer in spec.layers[1:]), names
    fps = _fingerprints(spec)[1:-1]
    assert len(set(fps)) <= 2 and fps.count(fps[0]) >= 3, names
    assert_roundtrip(spec, loss, params, _batch(), cuts=(1, 2, 3, 4, 5))


def test_layers_n_groups_whole_blocks_and_names_the_possible_n() -> None:
    kinds = ["dense"] * 4
    params, loss = _model(kinds)
    per_block = _trace(loss, params)
    bounds = np.cumsum([0.0] + [layer.flops for layer in per_block.layers])
    for n in (2, 3, 4, 6):
        spec = _trace(loss, params, layers=n)
        assert spec.num_layers == n
        ends = np.cumsum([layer.flops for layer in spec.layers])
        assert all(np.isclose(bounds, e, rtol=1e-9).any() for e in ends), (n, ends, bounds)
        # groups of the same number of whole blocks (no embedding, no head) are equal
        groups: dict[float, set[str]] = {}
        for layer in spec.layers:
            if not any(V in p.shape for p in layer.params):
                groups.setdefault(round(layer.flops), set()).add(layer.fingerprint)
        assert all(len(fps) == 1 for fps in groups.values()), n
    assert_roundtrip(spec, loss, params, _batch(), cuts=(2, 4))
    with pytest.raises(ValueError, match=r"layers=7: .* 6 layers .* between 1 and 6"):
        _trace(loss, params, layers=7)


class _Block(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        y = nn.Dense(2 * H, name="up")(nn.LayerNorm(name="ln")(x))
        return x + nn.Dense(H, name="down")(nn.gelu(y))


class _LM(nn.Module):
    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(V, H, name="wte")(tokens)
        for i in range(3):
            x = _Block(name=f"h_{i}")(x)
        return nn.Dense(V, name="head")(nn.LayerNorm(name="ln_f")(x))


def _linen() -> tuple[Callable, Any]:
    model = _LM()
    params = model.init(jax.random.key(0), _batch()["x"])

    def loss(p: Any, b: dict[str, jax.Array]) -> jax.Array:
        logp = jax.nn.log_softmax(model.apply(p, b["x"]))
        return -jnp.mean(jnp.take_along_axis(logp, b["y"][..., None], -1))

    return loss, params


def _nnx(scan: bool) -> tuple[Callable, Any]:
    from tests.support.library_models import nnx_list, nnx_scan

    built = nnx_scan() if scan else nnx_list()
    return built.loss_fn, built.params


@pytest.mark.parametrize("named_calls", [True, False], ids=["linen", "linen-no-named-calls"])
def test_a_linen_loss_jitted_first_gives_the_same_spec(named_calls: bool) -> None:
    loss, params = _linen()
    fresh = _trace(loss, params)
    assert [layer.name for layer in fresh.layers] == ["wte", "h_0", "h_1", "h_2", "ln_f"]
    switch = nn.enable_named_call if named_calls else nn.disable_named_call
    try:
        switch()
        jax.jit(loss)(params, _batch())
        again = _trace(loss, params)
    finally:
        nn.enable_named_call()
    assert again == fresh


@pytest.mark.parametrize("scan", [False, True], ids=["nnx-list", "nnx-scan"])
def test_an_nnx_loss_jitted_first_gives_the_same_spec(scan: bool) -> None:
    loss, params = _nnx(scan)
    jax.jit(loss)(params, _batch())  # before the first trace
    jitted_first = _trace(loss, params)
    fresh_loss, fresh_params = _nnx(scan)
    fresh = _trace(fresh_loss, fresh_params)
    assert jitted_first == fresh
    assert len({fp for fp in _fingerprints(fresh)[1:-1]}) == 1
    assert fresh.num_layers == 6


def test_prng_keys_among_params_are_refused_by_name() -> None:
    params, loss = _model(["dense"] * 2)
    params["dropout_key"] = jax.random.key(3)
    with pytest.raises(ValueError, match=r"'dropout_key' is a PRNG key .* nnx.split"):
        _trace(loss, params)


def test_a_jitted_loss_without_scopes_is_cut_into_its_blocks() -> None:
    params, loss = _model(["dense"] * 3)
    spec = _trace(jax.jit(loss), params)
    _assert_kinds(spec, ["dense"] * 3)


def test_a_key_the_loss_makes_is_made_again_in_each_block() -> None:
    """A PRNG key made from a constant before the blocks and used by each (dropout-like)
    cannot cross a layer boundary: each block makes it again."""
    params, _ = _model(["dense"] * 3)

    def loss(p: dict, b: dict[str, jax.Array]) -> jax.Array:
        key = jax.random.key(0)
        x = p["embed"][b["x"]]
        for bp in p["blocks"]:
            x = dense_block(x, bp) * jax.random.bernoulli(key, 0.9, x.shape)
        return jnp.mean((_norm(x) @ p["head"]) ** 2)

    spec = _trace(loss, params)
    assert spec.num_layers == 5
    assert len({layer.fingerprint for layer in spec.layers[1:-1]}) == 1
    assert_roundtrip(spec, loss, params, _batch(), cuts=(1, 2, 3, 4))
