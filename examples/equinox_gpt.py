"""An equinox GPT, its blocks in a Python list, traced into layers with no markers.

    .venv/bin/python examples/equinox_gpt.py
    .venv/bin/python examples/equinox_gpt.py --blocks 8 --out spec.json
    stageprof plan --model spec.json --devices-per-host 2

Written as equinox users write models: `eqx.nn` layers, per-token layers `jax.vmap`ped, the
model split with `eqx.partition(model, eqx.is_array)` into the arrays (the params the tracer
names, e.g. `blocks/0/attn/query_proj/weight`) and the rest, which the loss closes over and
recombines. Layers: the embeddings, one per block (one fingerprint), the final norm and head.
"""

import argparse
import sys
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spec_check import show_and_write  # noqa: E402

VOCAB, SEQ, BATCH = 1000, 32, 4  # BATCH: one micro-batch


class Block(eqx.Module):
    """A pre-norm GPT-2 block on one sequence `(SEQ, hidden)`."""

    ln_1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    ln_2: eqx.nn.LayerNorm
    fc: eqx.nn.Linear
    proj: eqx.nn.Linear

    def __init__(self, hidden: int, key: jax.Array) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.ln_1 = eqx.nn.LayerNorm(hidden)
        self.attn = eqx.nn.MultiheadAttention(max(1, hidden // 16), hidden, key=k1)
        self.ln_2 = eqx.nn.LayerNorm(hidden)
        self.fc = eqx.nn.Linear(hidden, 4 * hidden, key=k2)
        self.proj = eqx.nn.Linear(4 * hidden, hidden, key=k3)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jax.vmap(self.ln_1)(x)
        x = x + self.attn(y, y, y, mask=jnp.tril(jnp.ones((x.shape[0], x.shape[0]), bool)))
        y = jax.vmap(self.fc)(jax.vmap(self.ln_2)(x))
        return x + jax.vmap(self.proj)(jax.nn.gelu(y))


class GPT(eqx.Module):
    wte: eqx.nn.Embedding
    wpe: eqx.nn.Embedding
    blocks: list[Block]
    ln_f: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, blocks: int, hidden: int, key: jax.Array) -> None:
        keys = jax.random.split(key, blocks + 3)
        self.wte = eqx.nn.Embedding(VOCAB, hidden, key=keys[0])
        self.wpe = eqx.nn.Embedding(SEQ, hidden, key=keys[1])
        self.blocks = [Block(hidden, k) for k in keys[3:]]
        self.ln_f = eqx.nn.LayerNorm(hidden)
        self.head = eqx.nn.Linear(hidden, VOCAB, key=keys[2])

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = jax.vmap(self.wte)(tokens) + jax.vmap(self.wpe)(jnp.arange(tokens.shape[0]))
        for block in self.blocks:
            x = block(x)
        return jax.vmap(self.head)(jax.vmap(self.ln_f)(x))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--out", type=Path, help="write the spec JSON here")
    args = parser.parse_args(argv)

    params, static = eqx.partition(GPT(args.blocks, args.hidden, jax.random.key(0)), eqx.is_array)
    tokens = jax.random.randint(jax.random.key(1), (BATCH, SEQ + 1), 0, VOCAB)
    batch = {"x": tokens[:, :-1], "y": tokens[:, 1:]}

    def loss_fn(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        logits = jax.vmap(eqx.combine(params, static))(batch["x"])
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]))

    spec = client.trace(loss_fn, params, batch, name="equinox_gpt")
    show_and_write(spec, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
