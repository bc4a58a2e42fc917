"""Transformer pieces shared by `gpt` and `moe`: embedding, attention block, LM head + loss.

Parameters are dicts of `jax.ShapeDtypeStruct`; logical axes use 'embed', 'heads', 'mlp',
'vocab' (MaxText's names; the sharding rules map them to mesh axes, `schemas.sharding`).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp

from client.layers import layer
from client.zoo.base import Built, f32

EPS = 1e-5


def check_heads(hidden: int, heads: int) -> None:
    if hidden % heads:
        raise ValueError(f"hidden_size {hidden} must be divisible by num_heads {heads}")


def embed_params(vocab: int, seq: int, hidden: int) -> dict[str, jax.ShapeDtypeStruct]:
    return {"wte": f32(vocab, hidden), "wpe": f32(seq, hidden)}


def embed_axes(prefix: str) -> dict[str, tuple[str | None, ...]]:
    return {f"{prefix}/wte": ("vocab", "embed"), f"{prefix}/wpe": (None, "embed")}


def embed(p: dict[str, jax.Array], tokens: jax.Array) -> jax.Array:
    return jnp.take(p["wte"], tokens, axis=0) + p["wpe"][None, : tokens.shape[1]]


def attention_params(hidden: int) -> dict[str, jax.ShapeDtypeStruct]:
    p = {"ln1_scale": f32(hidden), "ln1_bias": f32(hidden)}
    p.update({w: f32(hidden, hidden) for w in ("wq", "wk", "wv", "wo")})
    p.update({b: f32(hidden) for b in ("bq", "bk", "bv", "bo")})
    return p


def attention_axes(prefix: str) -> dict[str, tuple[str | None, ...]]:
    axes: dict[str, tuple[str | None, ...]] = {
        f"{prefix}/ln1_scale": ("embed",),
        f"{prefix}/ln1_bias": ("embed",),
        f"{prefix}/wo": ("heads", "embed"),
        f"{prefix}/bo": ("embed",),
    }
    for n in "qkv":
        axes[f"{prefix}/w{n}"] = ("embed", "heads")
        axes[f"{prefix}/b{n}"] = ("heads",)
    return axes


def mlp_params(hidden: int, ffn: int) -> dict[str, jax.ShapeDtypeStruct]:
    return {
        "ln2_scale": f32(hidden),
        "ln2_bias": f32(hidden),
        "w1": f32(hidden, ffn),
        "b1": f32(ffn),
        "w2": f32(ffn, hidden),
        "b2": f32(hidden),
    }


def mlp_axes(prefix: str) -> dict[str, tuple[str | None, ...]]:
    return {
        f"{prefix}/ln2_scale": ("embed",),
        f"{prefix}/ln2_bias": ("embed",),
        f"{prefix}/w1": ("embed", "mlp"),
        f"{prefix}/b1": ("mlp",),
        f"{prefix}/w2": ("mlp", "embed"),
        f"{prefix}/b2": ("embed",),
    }


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + EPS) * scale + bias


def attention(p: dict[str, jax.Array], x: jax.Array, heads: int) -> jax.Array:
    """Pre-LN causal self-attention with its residual: x + attn(ln(x))."""
    b, s, h = x.shape
    y = layer_norm(x, p["ln1_scale"], p["ln1_bias"])

    def split(w: str, bias: str) -> jax.Array:
        return (y @ p[w] + p[bias]).reshape(b, s, heads, h // heads)

    q, k, v = split("wq", "bq"), split("wk", "bk"), split("wv", "bv")
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(h // heads))
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, s, h)
    return x + out @ p["wo"] + p["bo"]


def mlp(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """Pre-LN feed-forward with its residual: x + w2(gelu(w1(ln(x))))."""
    y = layer_norm(x, p["ln2_scale"], p["ln2_bias"])
    return x + jax.nn.gelu(y @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def head_params(hidden: int, vocab: int) -> dict[str, jax.ShapeDtypeStruct]:
    return {"lnf_scale": f32(hidden), "lnf_bias": f32(hidden), "w_out": f32(hidden, vocab)}


def head_axes(prefix: str) -> dict[str, tuple[str | None, ...]]:
    return {
        f"{prefix}/lnf_scale": ("embed",),
        f"{prefix}/lnf_bias": ("embed",),
        f"{prefix}/w_out": ("embed", "vocab"),
    }


def lm_loss(p: dict[str, jax.Array], x: jax.Array, labels: jax.Array) -> jax.Array:
    """Final LN, logits, mean softmax cross-entropy against `labels`."""
    logits = layer_norm(x, p["lnf_scale"], p["lnf_bias"]) @ p["w_out"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


def token_batch(batch: int, seq: int) -> dict[str, jax.ShapeDtypeStruct]:
    shape = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return {"tokens": shape, "labels": shape}


def sample_tokens(key: jax.Array, batch: int, seq: int, vocab: int) -> dict[str, jax.Array]:
    kt, kl = jax.random.split(key)
    return {
        "tokens": jax.random.randint(kt, (batch, seq), 0, vocab, dtype=jnp.int32),
        "labels": jax.random.randint(kl, (batch, seq), 0, vocab, dtype=jnp.int32),
    }


Block = Callable[[int, dict[str, jax.Array], jax.Array], jax.Array]


def language_model(
    params: dict,
    axes: dict[str, tuple[str | None, ...]],
    block: Block,
    batch: int,
    seq: int,
    vocab: int,
) -> Built:
    """Layers [embed, block0 … blockN-1, head + loss] around `block(i, params_i, x) -> x`."""

    def loss_fn(p: dict, tokens: dict[str, jax.Array]) -> jax.Array:
        with layer("embed"):
            x = embed(p["embed"], tokens["tokens"])
        for i, bp in enumerate(p["blocks"]):
            with layer(f"block{i}"):
                x = block(i, bp, x)
        with layer("head"):
            return lm_loss(p["head"], x, tokens["labels"])

    return Built(
        loss_fn,
        params,
        token_batch(batch, seq),
        axes,
        lambda k: sample_tokens(k, batch, seq, vocab),
    )
