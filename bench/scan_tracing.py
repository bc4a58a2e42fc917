"""Tracing a scanned GPT (`nn.scan` over its blocks, the layer axis at 1 as MaxText stacks it)
beside the same GPT unrolled (a Python loop of blocks): seconds of `client.trace` and the size
of each spec's JSON and of its distinct programs (base64; and as StableHLO text without
source locations), side by side. Both give one layer per block.

    python bench/scan_tracing.py --blocks 64 --hidden 64

Prints a table and, as its last line, one JSON object.
"""

import argparse
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
from common import console, emit_json, setup_logging
from rich.table import Table

import client
from programs.fingerprint import canonical_module
from programs.load import load_program

VOCAB, SEQ, BATCH = 256, 32, 8


class Block(nn.Module):
    """A pre-norm GPT-2 block in the scan signature `(x, _) -> (x, None)`."""

    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array, _: None) -> tuple[jax.Array, None]:
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
        y = nn.LayerNorm(name="ln_1")(x)
        heads = max(1, self.hidden // 32)
        x = x + nn.MultiHeadDotProductAttention(heads, name="attn")(y, mask=mask)
        y = nn.Dense(4 * self.hidden, name="fc")(nn.LayerNorm(name="ln_2")(x))
        return x + nn.Dense(self.hidden, name="proj")(nn.gelu(y)), None


class GPT(nn.Module):
    blocks: int
    hidden: int
    scanned: bool

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(VOCAB, self.hidden, name="wte")(tokens)
        x = x + self.param("wpe", nn.initializers.normal(0.02), (SEQ, self.hidden))
        if self.scanned:
            stack = nn.scan(
                Block,
                variable_axes={"params": 1},
                split_rngs={"params": True},
                length=self.blocks,
            )
            x, _ = stack(self.hidden, name="h")(x, None)
        else:
            for i in range(self.blocks):
                x, _ = Block(self.hidden, name=f"h_{i}")(x, None)
        return nn.Dense(VOCAB, name="lm_head")(nn.LayerNorm(name="ln_f")(x))


def measure(blocks: int, hidden: int, scanned: bool) -> dict[str, float]:
    """Seconds to trace the model into a spec (params abstract), and the spec's JSON bytes."""
    model = GPT(blocks, hidden, scanned)
    tokens = jnp.zeros((BATCH, SEQ), jnp.int32)
    params = jax.eval_shape(model.init, jax.random.key(0), tokens)
    batch = {"x": tokens, "y": tokens}

    def loss(p: dict, b: dict[str, jax.Array]) -> jax.Array:
        logp = jax.nn.log_softmax(model.apply(p, b["x"]))
        return -jnp.mean(jnp.take_along_axis(logp, b["y"][..., None], axis=-1))

    start = time.perf_counter()
    spec = client.trace(loss, params, batch, name="gpt")
    seconds = time.perf_counter() - start
    programs = {layer.forward for layer in spec.layers} | {layer.backward for layer in spec.layers}
    return {
        "trace_s": seconds,
        "layers": spec.num_layers,
        "spec_bytes": len(spec.model_dump_json()),
        "distinct_program_bytes": sum(len(p) for p in programs),
        "distinct_program_chars_no_locations": sum(
            len(canonical_module(load_program(p))) for p in programs
        ),
        "block_fingerprints": len({layer.fingerprint for layer in spec.layers[1:-1]}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    setup_logging()
    measure(2, args.hidden, True)  # warm up jax and flax once, outside the timings
    rows = {
        kind: measure(args.blocks, args.hidden, kind == "scanned")
        for kind in ("unrolled", "scanned")
    }
    table = Table(title=f"tracing a {args.blocks}-block GPT, hidden {args.hidden}")
    table.add_column("")
    for kind in rows:
        table.add_column(kind, justify="right")
    for key in rows["scanned"]:
        table.add_row(
            key, *(f"{rows[k][key]:.2f}" if key == "trace_s" else f"{rows[k][key]:,}" for k in rows)
        )
    console().print(table)
    emit_json({"blocks": args.blocks, "hidden": args.hidden, **rows})


if __name__ == "__main__":
    main()
