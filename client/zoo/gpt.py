"""GPT: layers = [embedding, num_layers transformer blocks, LM head + loss]."""

from client.zoo import transformer as tf
from client.zoo.base import Built, Config, ZooModel

DEFAULTS = {
    "num_layers": 2,  # quick by default (plans in under a minute on 2 CPU cores)
    "hidden_size": 64,
    "num_heads": 4,
    "seq_len": 32,
    "vocab_size": 512,
    "batch_size": 8,
}

# Alpa's GPT benchmark sizes (benchmark/alpa/suite_manual_gpt.py, `gpt_specs`).
PRESETS = {
    name: {"seq_len": s, "hidden_size": h, "num_layers": n, "num_heads": a, "vocab_size": v}
    for name, (s, h, n, a, v) in {
        "125M": (1024, 768, 12, 12, 51200),
        "350M": (1024, 1024, 24, 16, 51200),
        "760M": (1024, 1536, 24, 16, 51200),
        "1.3B": (1024, 2048, 24, 32, 51200),
        "2.6B": (1024, 2560, 32, 32, 51200),
        "6.7B": (1024, 4096, 32, 32, 51200),
        "15B": (1024, 5120, 48, 40, 51200),
        "39B": (1024, 8192, 48, 64, 51200),
        "76B": (1024, 10240, 60, 80, 51200),
    }.items()
}


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
    description="GPT: embedding, num_layers pre-LN transformer blocks, LM head + loss.",
    defaults=DEFAULTS,
    make=make,
    presets=PRESETS,
)
