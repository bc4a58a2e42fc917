"""Wide-ResNet (Alpa's benchmark model, after flax's ImageNet ResNet): layers = [stem, one
layer per residual block, head (pool, dense, softmax cross-entropy)].

Batch norm uses the micro-batch's statistics (training mode, no running averages), so the
loss is a pure function of params and batch.
"""

import jax
import jax.numpy as jnp

from client.layers import layer
from client.zoo.base import Built, Config, ZooModel, f32
from schemas.zoo_sizes import WRESNET_STAGES, ZOO_SIZES

SIZES = ZOO_SIZES["wresnet"]
STAGES = WRESNET_STAGES

_DIMS = ("NHWC", "HWIO", "NHWC")


def conv(x: jax.Array, w: jax.Array, stride: int = 1) -> jax.Array:
    k = w.shape[0]
    pad = ((k - 1) // 2, k // 2)
    return jax.lax.conv_general_dilated(x, w, (stride, stride), (pad, pad), dimension_numbers=_DIMS)


def batch_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    mean = jnp.mean(x, axis=(0, 1, 2))
    var = jnp.var(x, axis=(0, 1, 2))
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale + bias


def _conv_bn(name: str, k: int, cin: int, cout: int) -> dict[str, jax.ShapeDtypeStruct]:
    return {
        f"{name}_w": f32(k, k, cin, cout),
        f"{name}_scale": f32(cout),
        f"{name}_bias": f32(cout),
    }


def _apply(p: dict[str, jax.Array], name: str, x: jax.Array, stride: int = 1) -> jax.Array:
    return batch_norm(conv(x, p[f"{name}_w"], stride), p[f"{name}_scale"], p[f"{name}_bias"])


def block_params(cin: int, filters: int, width: int, bottleneck: bool, stride: int) -> dict:
    if bottleneck:
        cout = 4 * filters
        p = _conv_bn("conv1", 1, cin, filters)
        p |= _conv_bn("conv2", 3, filters, filters * width)
        p |= _conv_bn("conv3", 1, filters * width, cout)
    else:
        if width != 1:
            raise ValueError(
                "wresnet: width_factor must be 1 for 6, 10, 18 and 34 layers (basic blocks)"
            )
        cout = filters
        p = _conv_bn("conv1", 3, cin, filters) | _conv_bn("conv2", 3, filters, filters)
    if cin != cout or stride != 1:
        p |= _conv_bn("proj", 1, cin, cout)
    return p


def block(p: dict[str, jax.Array], x: jax.Array, stride: int) -> jax.Array:
    """A residual block: basic (two 3x3) or bottleneck (1x1, 3x3 wide, 1x1), projected skip."""
    if "conv3_w" in p:
        y = jax.nn.relu(_apply(p, "conv1", x))
        y = jax.nn.relu(_apply(p, "conv2", y, stride))
        y = _apply(p, "conv3", y)
    else:
        y = jax.nn.relu(_apply(p, "conv1", x, stride))
        y = _apply(p, "conv2", y)
    skip = _apply(p, "proj", x, stride) if "proj_w" in p else x
    return jax.nn.relu(skip + y)


def make(c: Config) -> Built:
    if c["num_layers"] not in STAGES:
        raise ValueError(f"wresnet: num_layers must be one of {sorted(STAGES)}")
    stages, bottleneck = STAGES[c["num_layers"]]
    size, ch, width = c["image_size"], c["num_channels"], c["width_factor"]
    classes, b = c["num_classes"], c["batch_size"]
    blocks, strides, cin = [], [], ch
    for i, count in enumerate(stages):
        for j in range(count):
            stride = 2 if i > 0 and j == 0 else 1
            blocks.append(block_params(cin, ch * 2**i, width, bottleneck, stride))
            strides.append(stride)
            cin = ch * 2**i * (4 if bottleneck else 1)
    params = {
        "stem": _conv_bn("conv", 7, 3, ch),
        "blocks": blocks,
        "head": {"w": f32(cin, classes), "b": f32(classes)},
    }
    axes = {"head/w": ("embed", "vocab"), "head/b": ("vocab",)}

    def loss_fn(p: dict, batch: dict[str, jax.Array]) -> jax.Array:
        with layer("stem"):
            x = jax.nn.relu(_apply(p["stem"], "conv", batch["images"], 2))
            x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
        for i, (bp, stride) in enumerate(zip(p["blocks"], strides, strict=True)):
            with layer(f"block{i}"):
                x = block(bp, x, stride)
        with layer("head"):
            logits = jnp.mean(x, axis=(1, 2)) @ p["head"]["w"] + p["head"]["b"]
            logp = jax.nn.log_softmax(logits, axis=-1)
            return -jnp.mean(jnp.take_along_axis(logp, batch["labels"][:, None], axis=-1))

    def sample_batch(key: jax.Array) -> dict[str, jax.Array]:
        ki, kl = jax.random.split(key)
        return {
            "images": jax.random.normal(ki, (b, size, size, 3)),
            "labels": jax.random.randint(kl, (b,), 0, classes, dtype=jnp.int32),
        }

    batch = {
        "images": f32(b, size, size, 3),
        "labels": jax.ShapeDtypeStruct((b,), jnp.int32),
    }
    return Built(loss_fn, params, batch, axes, sample_batch)


MODEL = ZooModel(
    name="wresnet",
    description=SIZES.description,
    defaults=SIZES.defaults,
    make=make,
    presets=SIZES.presets,
)
