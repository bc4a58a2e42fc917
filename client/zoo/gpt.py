"""GPT: layers = [embedding, num_layers transformer blocks, LM head + loss]."""

from client.zoo import transformer as tf
from client.zoo.base import Built, Config, ZooModel
from schemas.zoo_sizes import ZOO_SIZES

SIZES = ZOO_SIZES["gpt"]


def make(c: Config) -> Built:
    n, h, heads = c["num_layers"], c["hidden_size"], c["num_heads"]
    s, v, b = c["seq_len"], c["vocab_size"], c["batch_size"]
    tf.check_heads(h, heads)
    blocks = [tf.attention_params(h) | tf.mlp_params(h, 4 * h) for _ in range(n)]
    params = {
        "embed": tf.embed_params(v, s, h),
        "blocks": blocks,
        "head": tf.head_params(h, v),
    }
    axes = tf.embed_axes("embed") | tf.head_axes("head")
    for i in range(n):
        axes |= tf.attention_axes(f"blocks/{i}") | tf.mlp_axes(f"blocks/{i}")

    return tf.language_model(
        params, axes, lambda _i, bp, x: tf.mlp(bp, tf.attention(bp, x, heads)), b, s, v
    )


MODEL = ZooModel(
    name="gpt",
    description=SIZES.description,
    defaults=SIZES.defaults,
    make=make,
    presets=SIZES.presets,
)
