"""MoE transformer (Alpa's benchmark model): blocks alternate a top-2 mixture-of-experts FFN
(even blocks) and a dense FFN (odd blocks); layers = [embedding, blocks, LM head + loss]."""

import jax
import jax.numpy as jnp

from client.zoo import transformer as tf
from client.zoo.base import Built, Config, ZooModel, f32
from schemas.zoo_sizes import ZOO_SIZES

SIZES = ZOO_SIZES["moe"]


def moe_params(hidden: int, ffn: int, experts: int) -> dict[str, jax.ShapeDtypeStruct]:
    return {
        "ln2_scale": f32(hidden),
        "ln2_bias": f32(hidden),
        "moe_wg": f32(hidden, experts),
        "moe_wi": f32(experts, hidden, ffn),
        "moe_wo": f32(experts, ffn, hidden),
    }


def moe_axes(prefix: str) -> dict[str, tuple[str | None, ...]]:
    return {
        f"{prefix}/ln2_scale": ("embed",),
        f"{prefix}/ln2_bias": ("embed",),
        f"{prefix}/moe_wg": ("embed", None),
        f"{prefix}/moe_wi": ("experts", "embed", None),
        f"{prefix}/moe_wo": ("experts", None, "embed"),
    }


def top2_routing(gates: jax.Array, capacity: int) -> jax.Array:
    """Combine weights [G, S, E, C] for top-2 routing of gate probabilities [G, S, E].

    Each token goes to its two best experts, at the next free slot of each; tokens past an
    expert's `capacity` are dropped. The two gates are renormalised to sum to one.
    """
    experts = gates.shape[-1]
    combine = jnp.zeros((*gates.shape, capacity), gates.dtype)
    taken = jnp.zeros(gates.shape[:1] + gates.shape[2:], jnp.int32)  # [G, E] slots used
    chosen, remaining = [], gates
    for _ in range(2):
        mask = jax.nn.one_hot(jnp.argmax(remaining, axis=-1), experts, dtype=jnp.int32)
        slot = jnp.cumsum(mask, axis=1) - mask + taken[:, None, :]  # [G, S, E]
        mask = mask * (slot < capacity)
        taken = taken + jnp.sum(mask, axis=1)
        chosen.append((mask, jnp.sum(slot * mask, axis=-1), jnp.sum(gates * mask, axis=-1)))
        remaining = remaining * (1 - mask)
    denom = chosen[0][2] + chosen[1][2]
    denom = jnp.where(denom > 0, denom, 1.0)
    for mask, slot, gate in chosen:
        weight = (gate / denom)[..., None] * mask  # [G, S, E]
        combine = combine + weight[..., None] * jax.nn.one_hot(slot, capacity)[:, :, None, :]
    return combine


def moe_ffn(p: dict[str, jax.Array], x: jax.Array, group: int) -> jax.Array:
    """Pre-LN top-2 MoE feed-forward with its residual."""
    b, s, h = x.shape
    experts = p["moe_wg"].shape[1]
    y = tf.layer_norm(x, p["ln2_scale"], p["ln2_bias"])
    tokens = y.reshape(-1, group, h)  # [G, S_, H]
    gates = jax.nn.softmax(jnp.einsum("gsh,he->gse", tokens, p["moe_wg"]), axis=-1)
    combine = top2_routing(gates, max(1, 2 * group // experts))
    dispatch = (combine > 0).astype(x.dtype)
    expert_in = jnp.einsum("gsec,gsh->egch", dispatch, tokens)
    hidden = jax.nn.relu(jnp.einsum("egch,ehf->egcf", expert_in, p["moe_wi"]))
    expert_out = jnp.einsum("egcf,efh->egch", hidden, p["moe_wo"])
    return x + jnp.einsum("gsec,egch->gsh", combine, expert_out).reshape(b, s, h)


def make(c: Config) -> Built:
    n, h, heads = c["num_layers"], c["hidden_size"], c["num_heads"]
    s, v, b = c["seq_len"], c["vocab_size"], c["batch_size"]
    experts, group = c["num_experts"], c["expert_group_size"]
    tf.check_heads(h, heads)
    if (b * s) % group:
        raise ValueError(
            f"moe: batch_size * seq_len = {b * s} tokens must be a multiple of "
            f"expert_group_size {group}"
        )
    blocks = []
    axes = tf.embed_axes("embed") | tf.head_axes("head")
    for i in range(n):
        ffn = moe_params(h, 4 * h, experts) if i % 2 == 0 else tf.mlp_params(h, 4 * h)
        blocks.append(tf.attention_params(h) | ffn)
        prefix = f"blocks/{i}"
        axes |= tf.attention_axes(prefix)
        axes |= moe_axes(prefix) if i % 2 == 0 else tf.mlp_axes(prefix)
    params = {"embed": tf.embed_params(v, s, h), "blocks": blocks, "head": tf.head_params(h, v)}

    def block(i: int, bp: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        x = tf.attention(bp, x, heads)
        return moe_ffn(bp, x, group) if i % 2 == 0 else tf.mlp(bp, x)

    return tf.language_model(params, axes, block, b, s, v)


MODEL = ZooModel(
    name="moe",
    description=SIZES.description,
    defaults=SIZES.defaults,
    make=make,
    presets=SIZES.presets,
)
