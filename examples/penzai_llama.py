"""Penzai's own llama-like transformer, its blocks a `LayerStack` (a scan over stacked
parameters) or a plain sequence, traced into layers with no markers.

    .venv/bin/python examples/penzai_llama.py                  # use_layer_stack=True
    .venv/bin/python examples/penzai_llama.py --no-layer-stack --out spec.json
    stageprof plan --model spec.json --devices-per-host 2

The model comes from `llamalike_common.build_llamalike_transformer` with random init. Penzai
keeps parameters inside the model; `pz.unbind_params(model, freeze=True)` takes them out, and
the loss binds them back: the params the tracer sees are `{label: value}` (a stacked
parameter's slices are named `<label>/data_array[i]`). Layers: the embedding, one per block
(one fingerprint, whether stacked or not), the final norm and head.
"""

import argparse
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax
from penzai import pz
from penzai.models.transformer.variants import llamalike_common

import client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spec_check import show_and_write  # noqa: E402

VOCAB, SEQ, BATCH = 1000, 32, 4  # BATCH: one micro-batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--no-layer-stack", dest="stack", action="store_false")
    parser.add_argument("--out", type=Path, help="write the spec JSON here")
    args = parser.parse_args(argv)

    heads = max(1, args.hidden // 16)
    config = llamalike_common.LlamalikeTransformerConfig(
        num_kv_heads=heads,
        query_head_multiplier=1,
        embedding_dim=args.hidden,
        projection_dim=args.hidden // heads,
        mlp_hidden_dim=2 * args.hidden,
        num_decoder_blocks=args.blocks,
        vocab_size=VOCAB,
        mlp_variant="swiglu",
        tie_embedder_and_logits=False,
        use_layer_stack=args.stack,
    )
    model = llamalike_common.build_llamalike_transformer(config, init_base_rng=jax.random.key(0))
    unbound, values = pz.unbind_params(model, freeze=True)
    params = {v.label: v.value for v in values}
    tokens = jax.random.randint(jax.random.key(1), (BATCH, SEQ + 1), 0, VOCAB)
    batch = {"x": tokens[:, :-1], "y": tokens[:, 1:]}

    def loss_fn(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        values = [pz.ParameterValue(label=k, value=v) for k, v in params.items()]
        logits = pz.bind_variables(unbound, values)(pz.nx.wrap(batch["x"]).tag("batch", "seq"))
        per_token = optax.softmax_cross_entropy_with_integer_labels(
            logits.unwrap("batch", "seq", "vocabulary"), batch["y"]
        )
        return jnp.mean(per_token)

    spec = client.trace(loss_fn, params, batch, name="penzai_llama")
    show_and_write(spec, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
