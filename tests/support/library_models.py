"""Models as other libraries write them, each built from a tiny config with random init (never
downloaded weights) and no stageprof markers, for tracing tests (issue 36).

Each builder returns a `Built(loss_fn, params, batch)`, ready for `client.trace(loss_fn,
params, batch)`; `LIBRARY_MODELS` says how many blocks each model has and, for a model whose
blocks are stacked along an axis and scanned over, which parameters are stacked (the `stacked`
argument of `tests.client.helpers.assert_roundtrip`). Library imports happen inside the
builders, so importing this module needs none of them.
"""

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from client.tracing import path_name

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers: never reach the Hub

BLOCKS, HIDDEN, HEADS, SEQ, BATCH = 4, 64, 4, 32, 2
VOCAB = 100  # no block parameter has a dimension of this size: the embedding and head do
SCAN_BLOCKS = 6  # the plain-JAX scan model


class Built(NamedTuple):
    """A loss `loss_fn(params, batch) -> scalar`, its params and one micro-batch."""

    loss_fn: Callable[[Any, Mapping[str, jax.Array]], jax.Array]
    params: Any
    batch: dict[str, jax.Array]


def _tokens(seed: int = 1) -> tuple[jax.Array, jax.Array]:
    """Inputs and next-token labels, (BATCH, SEQ) int32 each."""
    tokens = jax.random.randint(jax.random.key(seed), (BATCH, SEQ + 1), 0, VOCAB)
    return tokens[:, :-1], tokens[:, 1:]


def _lm_batch() -> dict[str, jax.Array]:
    x, y = _tokens()
    return {"x": x, "y": y}


def _xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


# --- transformers (4.57: the last releases with Flax models) --------------------------------


def hf_gpt2() -> Built:
    """transformers' `FlaxGPT2LMHeadModel`: embeddings `wte`/`wpe`, blocks `h/0..3`, `ln_f`."""
    from transformers import FlaxGPT2LMHeadModel, GPT2Config

    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=HIDDEN, n_layer=BLOCKS, n_head=HEADS
    )
    model = FlaxGPT2LMHeadModel(config, input_shape=(1, SEQ), seed=0)

    def loss_fn(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        return _xent(model(batch["x"], params=params, train=False).logits, batch["y"])

    return Built(loss_fn, model.params, _lm_batch())


def hf_llama() -> Built:
    """transformers' `FlaxLlamaForCausalLM` (RMSNorm, RoPE, SwiGLU), untied head."""
    from transformers import FlaxLlamaForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=BLOCKS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=SEQ,
    )
    model = FlaxLlamaForCausalLM(config, input_shape=(1, SEQ), seed=0)

    def loss_fn(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        return _xent(model(batch["x"], params=params, train=False).logits, batch["y"])

    return Built(loss_fn, model.params, _lm_batch())


def hf_bert() -> Built:
    """transformers' `FlaxBertForMaskedLM`; the loss is over the masked positions only."""
    from transformers import BertConfig, FlaxBertForMaskedLM

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=BLOCKS,
        num_attention_heads=HEADS,
        intermediate_size=2 * HIDDEN,
        max_position_embeddings=SEQ,
    )
    model = FlaxBertForMaskedLM(config, input_shape=(1, SEQ), seed=0)
    x, _ = _tokens()
    masked = jax.random.bernoulli(jax.random.key(2), 0.15, x.shape).at[:, 0].set(True)
    batch = {"x": jnp.where(masked, 0, x), "y": x, "mask": masked.astype(jnp.float32)}

    def loss_fn(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        logits = model(batch["x"], params=params, train=False).logits
        per_token = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
        return jnp.sum(per_token * batch["mask"]) / jnp.sum(batch["mask"])

    return Built(loss_fn, model.params, batch)


# --- equinox -------------------------------------------------------------------------------


def equinox_gpt() -> Built:
    """A GPT written as equinox users write one: `eqx.nn` layers, the blocks in a Python list,
    per-token layers vmapped; params are `eqx.partition(model, eqx.is_array)`."""
    import equinox as eqx

    class Block(eqx.Module):
        ln_1: eqx.nn.LayerNorm
        attn: eqx.nn.MultiheadAttention
        ln_2: eqx.nn.LayerNorm
        fc: eqx.nn.Linear
        proj: eqx.nn.Linear

        def __init__(self, key: jax.Array) -> None:
            k = jax.random.split(key, 3)
            self.ln_1 = eqx.nn.LayerNorm(HIDDEN)
            self.attn = eqx.nn.MultiheadAttention(HEADS, HIDDEN, key=k[0])
            self.ln_2 = eqx.nn.LayerNorm(HIDDEN)
            self.fc = eqx.nn.Linear(HIDDEN, 4 * HIDDEN, key=k[1])
            self.proj = eqx.nn.Linear(4 * HIDDEN, HIDDEN, key=k[2])

        def __call__(self, x: jax.Array) -> jax.Array:  # x: (SEQ, HIDDEN)
            y = jax.vmap(self.ln_1)(x)
            mask = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), bool))
            x = x + self.attn(y, y, y, mask=mask)
            y = jax.vmap(self.fc)(jax.vmap(self.ln_2)(x))
            return x + jax.vmap(self.proj)(jax.nn.gelu(y))

    class GPT(eqx.Module):
        wte: eqx.nn.Embedding
        wpe: eqx.nn.Embedding
        blocks: list[Block]
        ln_f: eqx.nn.LayerNorm
        head: eqx.nn.Linear

        def __init__(self, key: jax.Array) -> None:
            k = jax.random.split(key, BLOCKS + 3)
            self.wte = eqx.nn.Embedding(VOCAB, HIDDEN, key=k[0])
            self.wpe = eqx.nn.Embedding(SEQ, HIDDEN, key=k[1])
            self.blocks = [Block(k[3 + i]) for i in range(BLOCKS)]
            self.ln_f = eqx.nn.LayerNorm(HIDDEN)
            self.head = eqx.nn.Linear(HIDDEN, VOCAB, key=k[2])

        def __call__(self, tokens: jax.Array) -> jax.Array:  # tokens: (SEQ,)
            x = jax.vmap(self.wte)(tokens) + jax.vmap(self.wpe)(jnp.arange(tokens.shape[0]))
            for block in self.blocks:
                x = block(x)
            return jax.vmap(self.head)(jax.vmap(self.ln_f)(x))

    params, static = eqx.partition(GPT(jax.random.key(0)), eqx.is_array)

    def loss_fn(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        model = eqx.combine(params, static)
        return _xent(jax.vmap(model)(batch["x"]), batch["y"])

    return Built(loss_fn, params, _lm_batch())


# --- dm-haiku ------------------------------------------------------------------------------


def haiku_lm() -> Built:
    """A Haiku LM: `hk.Module` blocks kept in a Python list, `hk.transform`ed; Haiku names
    the first block `block` and the others `block_1`, `block_2`..."""
    import haiku as hk

    class Block(hk.Module):
        def __call__(self, x: jax.Array) -> jax.Array:
            mask = jnp.tril(jnp.ones((1, 1, x.shape[1], x.shape[1])))
            y = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(x)
            attn = hk.MultiHeadAttention(
                HEADS, HIDDEN // HEADS, w_init=hk.initializers.VarianceScaling(1.0)
            )
            x = x + attn(y, y, y, mask=mask)
            y = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(x)
            return x + hk.Linear(HIDDEN)(jax.nn.gelu(hk.Linear(4 * HIDDEN)(y)))

    class LM(hk.Module):
        def __call__(self, tokens: jax.Array) -> jax.Array:
            x = hk.Embed(VOCAB, HIDDEN)(tokens)
            x = x + hk.get_parameter("pos", (SEQ, HIDDEN), init=hk.initializers.RandomNormal())
            blocks = [Block() for _ in range(BLOCKS)]
            for block in blocks:
                x = block(x)
            x = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(x)
            return hk.Linear(VOCAB)(x)

    forward = hk.without_apply_rng(hk.transform(lambda tokens: LM()(tokens)))
    batch = _lm_batch()
    params = forward.init(jax.random.key(0), batch["x"])

    def loss_fn(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        return _xent(forward.apply(params, batch["x"]), batch["y"])

    return Built(loss_fn, params, batch)


# --- penzai --------------------------------------------------------------------------------


def penzai_llamalike(use_layer_stack: bool = True) -> Built:
    """Penzai's own llama-like transformer (`build_llamalike_transformer`); with
    `use_layer_stack` its blocks are a `LayerStack` (a scan over stacked parameters). Params
    are the unbound `ParameterValue`s, as `{label: value}`."""
    from penzai import pz
    from penzai.models.transformer.variants import llamalike_common

    config = llamalike_common.LlamalikeTransformerConfig(
        num_kv_heads=HEADS,
        query_head_multiplier=1,
        embedding_dim=HIDDEN,
        projection_dim=HIDDEN // HEADS,
        mlp_hidden_dim=2 * HIDDEN,
        num_decoder_blocks=BLOCKS,
        vocab_size=VOCAB,
        mlp_variant="swiglu",
        tie_embedder_and_logits=False,
        use_layer_stack=use_layer_stack,
    )
    model = llamalike_common.build_llamalike_transformer(config, init_base_rng=jax.random.key(0))
    unbound, values = pz.unbind_params(model, freeze=True)
    params = {v.label: v.value for v in values}

    def loss_fn(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        bound = pz.bind_variables(
            unbound, [pz.ParameterValue(label=k, value=v) for k, v in params.items()]
        )
        logits = bound(pz.nx.wrap(batch["x"]).tag("batch", "seq"))
        return _xent(logits.unwrap("batch", "seq", "vocabulary"), batch["y"])

    return Built(loss_fn, params, _lm_batch())


# --- plain JAX -----------------------------------------------------------------------------


def jax_scan() -> Built:
    """Plain JAX: an embedding, `lax.scan` over SCAN_BLOCKS stacked MLP blocks, a head; no
    scopes at all."""
    k = jax.random.split(jax.random.key(0), 4)
    scale = 1 / np.sqrt(HIDDEN)
    params = {
        "embed": jax.random.normal(k[0], (VOCAB, HIDDEN)) * scale,
        "blocks": {
            "scale": jnp.ones((SCAN_BLOCKS, HIDDEN)),
            "w1": jax.random.normal(k[1], (SCAN_BLOCKS, HIDDEN, 2 * HIDDEN)) * scale,
            "w2": jax.random.normal(k[2], (SCAN_BLOCKS, 2 * HIDDEN, HIDDEN)) * scale,
        },
        "head": jax.random.normal(k[3], (HIDDEN, VOCAB)) * scale,
    }

    def block(x: jax.Array, p: dict[str, jax.Array]) -> tuple[jax.Array, None]:
        y = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * p["scale"]
        return x + jax.nn.gelu(y @ p["w1"]) @ p["w2"], None

    def loss_fn(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        x = params["embed"][batch["x"]]
        x, _ = jax.lax.scan(block, x, params["blocks"])
        return _xent(x @ params["head"], batch["y"])

    return Built(loss_fn, params, _lm_batch())


# --- Flax NNX ------------------------------------------------------------------------------


def _nnx_block(dropout: float | None = None) -> type:
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.norm = nnx.LayerNorm(HIDDEN, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(HEADS, HIDDEN, decode=False, rngs=rngs)
            self.norm2 = nnx.LayerNorm(HIDDEN, rngs=rngs)
            self.up = nnx.Linear(HIDDEN, 2 * HIDDEN, rngs=rngs)
            self.down = nnx.Linear(2 * HIDDEN, HIDDEN, rngs=rngs)
            self.drop = nnx.Dropout(dropout, rngs=rngs) if dropout is not None else None

        def __call__(self, x: jax.Array) -> jax.Array:
            mask = nnx.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
            x = x + self.attn(self.norm(x), mask=mask)
            y = self.down(nnx.gelu(self.up(self.norm2(x))))
            return x + (self.drop(y) if self.drop is not None else y)

    return Block


def nnx_list() -> Built:
    """A Flax NNX model, blocks in an `nnx.List`; params are `nnx.split(model, nnx.Param)`."""
    from flax import nnx

    block = _nnx_block()

    class Model(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.embed = nnx.Embed(VOCAB, HIDDEN, rngs=rngs)
            self.layers = nnx.List([block(rngs) for _ in range(BLOCKS)])
            self.norm = nnx.LayerNorm(HIDDEN, rngs=rngs)
            self.head = nnx.Linear(HIDDEN, VOCAB, rngs=rngs)

        def __call__(self, tokens: jax.Array) -> jax.Array:
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x))

    graphdef, params = nnx.split(Model(nnx.Rngs(0)), nnx.Param)

    def loss_fn(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        return _xent(nnx.merge(graphdef, params)(batch["x"]), batch["y"])

    return Built(loss_fn, params, _lm_batch())


def nnx_scan() -> Built:
    """A Flax NNX model whose blocks are made by `nnx.vmap` and run by `nnx.scan` (the Flax
    guide's layer stack); every block parameter is stacked on axis 0."""
    from flax import nnx

    block = _nnx_block()

    class Model(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.embed = nnx.Embed(VOCAB, HIDDEN, rngs=rngs)

            @nnx.split_rngs(splits=BLOCKS)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def create(rngs: nnx.Rngs) -> nnx.Module:
                return block(rngs)  # type: ignore[no-any-return]

            self.layers = create(rngs)
            self.norm = nnx.LayerNorm(HIDDEN, rngs=rngs)
            self.head = nnx.Linear(HIDDEN, VOCAB, rngs=rngs)

        def __call__(self, tokens: jax.Array) -> jax.Array:
            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            def run(x: jax.Array, layer: nnx.Module) -> jax.Array:
                return layer(x)  # type: ignore[no-any-return]

            return self.head(self.norm(run(self.embed(tokens), self.layers)))

    graphdef, params = nnx.split(Model(nnx.Rngs(0)), nnx.Param)

    def loss_fn(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        return _xent(nnx.merge(graphdef, params)(batch["x"]), batch["y"])

    return Built(loss_fn, params, _lm_batch())


def nnx_dropout() -> Built:
    """An NNX list model with dropout on, its WHOLE state passed as params
    (`nnx.split(model)`): the dropout `RngKey` (a PRNG key array) and `RngCount` (uint32)
    leaves sit among the float parameters."""
    from flax import nnx

    block = _nnx_block(dropout=0.1)

    class Model(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.embed = nnx.Embed(VOCAB, HIDDEN, rngs=rngs)
            self.layers = nnx.List([block(rngs) for _ in range(BLOCKS)])
            self.norm = nnx.LayerNorm(HIDDEN, rngs=rngs)
            self.head = nnx.Linear(HIDDEN, VOCAB, rngs=rngs)

        def __call__(self, tokens: jax.Array) -> jax.Array:
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x))

    model = Model(nnx.Rngs(params=0, dropout=1))
    model.train()  # dropout on (`deterministic=False`)
    graphdef, state = nnx.split(model)

    def loss_fn(state: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        return _xent(nnx.merge(graphdef, state)(batch["x"]), batch["y"])

    return Built(loss_fn, state, _lm_batch())


def float_leaves(params: Any) -> dict[str, bool]:
    """Each params leaf, by spec name: whether it is a float array (trainable)."""
    return {
        path_name(p): jnp.issubdtype(jnp.asarray(v).dtype, jnp.floating)
        for p, v in jax.tree_util.tree_flatten_with_path(params)[0]
    }


def stacked_leaves(params: Any, inside: str, blocks: int) -> dict[str, int]:
    """The params leaves stacked along a leading layer axis (spec name -> 0): those whose
    name contains `inside`; each must have `blocks` on axis 0."""
    stacked = {}
    for path, value in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = path_name(path)
        if inside in name:
            assert value.shape[0] == blocks, (name, value.shape)
            stacked[name] = 0
    assert stacked, f"no parameter is stacked under {inside!r}"
    return stacked


# --- the table -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LibraryModel:
    """One model of the table: how to build it, its block count, its stacked parameters (a
    function of its params: spec name -> layer axis), the package it needs."""

    build: Callable[[], Built]
    blocks: int
    needs: str
    stacked: Callable[[Any], dict[str, int]] = field(default=lambda params: {})


LIBRARY_MODELS: dict[str, LibraryModel] = {
    "hf_gpt2": LibraryModel(hf_gpt2, BLOCKS, "transformers"),
    "hf_llama": LibraryModel(hf_llama, BLOCKS, "transformers"),
    "hf_bert": LibraryModel(hf_bert, BLOCKS, "transformers"),
    "equinox_gpt": LibraryModel(equinox_gpt, BLOCKS, "equinox"),
    "haiku_lm": LibraryModel(haiku_lm, BLOCKS, "haiku"),
    "penzai_stack": LibraryModel(
        lambda: penzai_llamalike(True),
        BLOCKS,
        "penzai",
        lambda p: stacked_leaves(p, "/blocks/", BLOCKS),
    ),
    "penzai_list": LibraryModel(lambda: penzai_llamalike(False), BLOCKS, "penzai"),
    "jax_scan": LibraryModel(
        jax_scan, SCAN_BLOCKS, "jax", lambda p: stacked_leaves(p, "blocks/", SCAN_BLOCKS)
    ),
    "nnx_list": LibraryModel(nnx_list, BLOCKS, "flax"),
    "nnx_scan": LibraryModel(
        nnx_scan, BLOCKS, "flax", lambda p: stacked_leaves(p, "layers/", BLOCKS)
    ),
    "nnx_dropout": LibraryModel(nnx_dropout, BLOCKS, "flax"),
}
