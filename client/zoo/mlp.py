"""The seeds' MLP: layers of dense d→4d, relu, dense 4d→d, relu; MSE loss."""

import jax
import jax.numpy as jnp

from client.layers import layer
from client.zoo.base import Built, Config, ZooModel, f32
from schemas.zoo_sizes import ZOO_SIZES

SIZES = ZOO_SIZES["mlp"]


def make(c: Config) -> Built:
    n, h, f, b = c["num_layers"], c["hidden_size"], c["ffn_size"], c["batch_size"]
    params = {
        f"layer{i}": {"w1": f32(h, f), "b1": f32(f), "w2": f32(f, h), "b2": f32(h)}
        for i in range(n)
    }
    axes = {}
    for i in range(n):
        axes.update(
            {
                f"layer{i}/w1": ("embed", "mlp"),
                f"layer{i}/b1": ("mlp",),
                f"layer{i}/w2": ("mlp", "embed"),
                f"layer{i}/b2": ("embed",),
            }
        )

    def loss_fn(p: dict[str, dict[str, jax.Array]], batch: dict[str, jax.Array]) -> jax.Array:
        x = batch["x"]
        for i in range(n):
            lp = p[f"layer{i}"]
            with layer(f"layer{i}"):
                x = jax.nn.relu(x @ lp["w1"] + lp["b1"])
                x = jax.nn.relu(x @ lp["w2"] + lp["b2"])
                if i == n - 1:
                    return jnp.mean((x - batch["y"]) ** 2)
        raise AssertionError("unreachable")

    def sample_batch(key: jax.Array) -> dict[str, jax.Array]:
        kx, ky = jax.random.split(key)
        return {"x": jax.random.normal(kx, (b, h)), "y": jax.random.normal(ky, (b, h))}

    return Built(loss_fn, params, {"x": f32(b, h), "y": f32(b, h)}, axes, sample_batch)


MODEL = ZooModel(
    name="mlp",
    description=SIZES.description,
    defaults=SIZES.defaults,
    make=make,
    presets=SIZES.presets,
)
