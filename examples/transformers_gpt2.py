"""transformers' own Flax GPT-2 (or Llama, or BERT), traced into layers with no markers.

    .venv/bin/python examples/transformers_gpt2.py                   # GPT-2, 4 blocks
    .venv/bin/python examples/transformers_gpt2.py --model bert --out spec.json
    stageprof plan --model spec.json --devices-per-host 2

Needs `transformers` 4.57 (the last release with the Flax models; no torch needed). The model
is built from a config with random weights (`FlaxGPT2LMHeadModel(config)`; a pretrained one
from `from_pretrained` traces the same way); its `params` and a loss that calls the model with
`params=` are all the tracer needs. Layers: the embeddings, one per block, the head.
"""

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax

import client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spec_check import show_and_write  # noqa: E402

VOCAB, SEQ, BATCH = 1000, 32, 4  # BATCH: one micro-batch


def build(kind: str, blocks: int, hidden: int) -> tuple[Any, Any]:
    """The model (random init from a tiny config) and its params."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers as hf

    heads = max(1, hidden // 16)
    cfg: hf.PretrainedConfig
    model: hf.FlaxPreTrainedModel
    if kind == "gpt2":
        cfg = hf.GPT2Config(
            vocab_size=VOCAB, n_positions=SEQ, n_embd=hidden, n_layer=blocks, n_head=heads
        )
        model = hf.FlaxGPT2LMHeadModel(cfg, input_shape=(1, SEQ), seed=0)
    elif kind == "llama":
        cfg = hf.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=blocks,
            num_attention_heads=heads,
            max_position_embeddings=SEQ,
        )
        model = hf.FlaxLlamaForCausalLM(cfg, input_shape=(1, SEQ), seed=0)
    else:
        cfg = hf.BertConfig(
            vocab_size=VOCAB,
            hidden_size=hidden,
            num_hidden_layers=blocks,
            num_attention_heads=heads,
            intermediate_size=2 * hidden,
            max_position_embeddings=SEQ,
        )
        model = hf.FlaxBertForMaskedLM(cfg, input_shape=(1, SEQ), seed=0)
    return model, model.params


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["gpt2", "llama", "bert"], default="gpt2")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--out", type=Path, help="write the spec JSON here")
    args = parser.parse_args(argv)

    model, params = build(args.model, args.blocks, args.hidden)
    tokens = jax.random.randint(jax.random.key(1), (BATCH, SEQ + 1), 0, VOCAB)
    # A causal LM predicts the next token; BERT (masked LM) is scored on its own input here.
    shift = 0 if args.model == "bert" else 1
    batch = {"x": tokens[:, :SEQ], "y": tokens[:, shift : SEQ + shift]}

    def loss_fn(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        logits = model(batch["x"], params=params, train=False).logits
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]))

    spec = client.trace(loss_fn, params, batch, name=f"hf_{args.model}")
    show_and_write(spec, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
