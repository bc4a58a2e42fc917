"""A dm-haiku language model, its blocks in a Python list, traced into layers with no markers.

    .venv/bin/python examples/haiku_lm.py
    .venv/bin/python examples/haiku_lm.py --blocks 8 --out spec.json
    stageprof plan --model spec.json --devices-per-host 2

Written as Haiku users write models: `hk.Module`s inside `hk.transform`; the params are what
`init` returns (`lm/~/block/~/linear`, `lm/~/block_1/~/linear`, ...: Haiku names the first
instance without an index), and the loss calls `apply`. Layers: the embedding, one per block (one
fingerprint), the final norm and head.
"""

import argparse
import sys
from pathlib import Path
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import optax

import client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spec_check import show_and_write  # noqa: E402

VOCAB, SEQ, BATCH = 1000, 32, 4  # BATCH: one micro-batch


class Block(hk.Module):
    """A pre-norm block: causal self-attention, then an MLP."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden

    def __call__(self, x: jax.Array) -> jax.Array:
        heads = max(1, self.hidden // 16)
        causal = jnp.tril(jnp.ones((1, 1, x.shape[1], x.shape[1])))
        y = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(x)
        w_init = hk.initializers.VarianceScaling(1.0)
        attn = hk.MultiHeadAttention(heads, self.hidden // heads, w_init=w_init)
        x = x + attn(y, y, y, mask=causal)
        y = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(x)
        return x + hk.Linear(self.hidden)(jax.nn.gelu(hk.Linear(4 * self.hidden)(y)))


class LM(hk.Module):
    """Embedding, `blocks` blocks kept in a list, final norm and head."""

    def __init__(self, blocks: int, hidden: int) -> None:
        super().__init__()
        self.blocks, self.hidden = blocks, hidden

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = hk.Embed(VOCAB, self.hidden)(tokens)
        pos = hk.get_parameter("pos", (SEQ, self.hidden), init=hk.initializers.RandomNormal())
        x = x + pos
        for block in [Block(self.hidden) for _ in range(self.blocks)]:
            x = block(x)
        x = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(x)
        return hk.Linear(VOCAB)(x)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--out", type=Path, help="write the spec JSON here")
    args = parser.parse_args(argv)

    forward: hk.Transformed = hk.without_apply_rng(
        hk.transform(lambda t: LM(args.blocks, args.hidden)(t))
    )
    tokens = jax.random.randint(jax.random.key(1), (BATCH, SEQ + 1), 0, VOCAB)
    batch = {"x": tokens[:, :-1], "y": tokens[:, 1:]}
    params = forward.init(jax.random.key(0), batch["x"])

    def loss_fn(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        logits = forward.apply(params, batch["x"])
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]))

    spec = client.trace(loss_fn, params, batch, name="haiku_lm")
    show_and_write(spec, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
