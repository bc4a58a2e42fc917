"""Hand-built `ModelSpec`s for workers tests: each layer a small `jax.export`ed function."""

import base64
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from schemas import LayerSpec, ModelSpec, ParamSpec, VarSpec


def export_program(fn: Callable, args: Sequence[VarSpec]) -> str:
    """`fn(*args)` exported with its VJP, serialized, base64."""
    structs = [jax.ShapeDtypeStruct(a.shape, jnp.dtype(a.dtype)) for a in args]
    exp = jax.export.export(jax.jit(fn))(*structs)
    return base64.b64encode(exp.serialize(vjp_order=1)).decode("ascii")


def make_layer(
    name: str,
    fn: Callable,
    params: list[ParamSpec],
    inputs: list[VarSpec],
    outputs: list[VarSpec],
    fingerprint: str = "",
) -> LayerSpec:
    """A layer whose program is `fn(*params, *inputs) -> tuple(outputs)`."""
    return LayerSpec(
        name=name,
        inputs=inputs,
        outputs=outputs,
        params=params,
        program=export_program(fn, [*params, *inputs]),
        fingerprint=fingerprint,
    )


def dense_spec(batch: int = 8, hidden: int = 16, ffn: int = 32, blocks: int = 2) -> ModelSpec:
    """x -> `blocks` × (dense hidden→ffn, relu, dense ffn→hidden) -> MSE against y."""
    x = VarSpec(name="x", shape=(batch, hidden), dtype="float32")
    y = VarSpec(name="y", shape=(batch, hidden), dtype="float32")

    def block(w1: jax.Array, b1: jax.Array, w2: jax.Array, h: jax.Array) -> tuple:
        return (jax.nn.relu(h @ w1 + b1) @ w2,)

    def head(h: jax.Array, target: jax.Array) -> tuple:
        return (jnp.mean((h - target) ** 2),)

    layers = []
    prev = x
    for i in range(blocks):
        out = VarSpec(name=f"h{i}", shape=(batch, hidden), dtype="float32")
        params = [
            ParamSpec(name=f"w1_{i}", shape=(hidden, ffn), dtype="float32"),
            ParamSpec(name=f"b1_{i}", shape=(ffn,), dtype="float32"),
            ParamSpec(name=f"w2_{i}", shape=(ffn, hidden), dtype="float32"),
        ]
        layers.append(make_layer(f"block{i}", block, params, [prev], [out], "block"))
        prev = out
    loss = VarSpec(name="loss", shape=(), dtype="float32")
    layers.append(make_layer("head", head, [], [prev, y], [loss], "head"))
    return ModelSpec(name="dense", inputs=[x, y], layers=layers, loss="loss")


def token_spec(batch: int = 8, vocab: int = 32, hidden: int = 16) -> ModelSpec:
    """Integer token ids and labels: embedding lookup -> logits -> cross entropy."""
    ids = VarSpec(name="ids", shape=(batch,), dtype="int32")
    labels = VarSpec(name="labels", shape=(batch,), dtype="int32")
    emb = ParamSpec(
        name="emb", shape=(vocab, hidden), dtype="float32", logical_axes=("vocab", "embed")
    )
    out_w = ParamSpec(
        name="out", shape=(hidden, vocab), dtype="float32", logical_axes=("embed", "vocab")
    )
    h = VarSpec(name="h", shape=(batch, hidden), dtype="float32")
    loss = VarSpec(name="loss", shape=(), dtype="float32")

    def embed(e: jax.Array, i: jax.Array) -> tuple:
        return (e[i],)

    def logits_loss(w: jax.Array, hh: jax.Array, lab: jax.Array) -> tuple:
        logp = jax.nn.log_softmax(hh @ w)
        return (-jnp.mean(jnp.take_along_axis(logp, lab[:, None], axis=1)),)

    layers = [
        make_layer("embed", embed, [emb], [ids], [h]),
        make_layer("head", logits_loss, [out_w], [h, labels], [loss]),
    ]
    return ModelSpec(name="tokens", inputs=[ids, labels], layers=layers, loss="loss")
