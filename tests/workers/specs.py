"""Hand-built `ModelSpec`s for workers tests: each layer a small `jax.export`ed function."""

from collections.abc import Callable, Collection

import jax
import jax.numpy as jnp

from client.export import export_layer_pair
from schemas import LayerSpec, ModelSpec, ParamSpec, VarSpec


def make_layer(
    name: str,
    fn: Callable,
    params: list[ParamSpec],
    inputs: list[VarSpec],
    outputs: list[VarSpec],
    fingerprint: str = "",
    batch: Collection[str] = ("x", "y", "ids", "labels"),
) -> LayerSpec:
    """A layer whose forward is `fn(*params, *inputs) -> tuple(outputs)`, exported as a
    forward-with-residuals/backward pair (`batch`: the model's batch input names)."""
    pair = export_layer_pair(fn, params, inputs, outputs, no_grad=batch)
    saved, grad_inputs = pair.names(inputs, outputs)
    return LayerSpec(
        name=name,
        inputs=inputs,
        outputs=outputs,
        params=params,
        forward=pair.forward,
        backward=pair.backward,
        residuals=pair.residuals,
        saved=saved,
        grad_inputs=grad_inputs,
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
