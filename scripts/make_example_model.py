"""Write server/example_model.json: the OpenAPI document's example model, a two-layer MLP
with real `jax.export` programs (the server checks every program it is sent).

    .venv/bin/python scripts/make_example_model.py
"""

import json
from pathlib import Path

import jax
import jax.numpy as jnp

import client

OUT = Path(__file__).resolve().parents[1] / "server" / "example_model.json"


def loss_fn(params: dict, batch: dict) -> jax.Array:
    with client.layer("dense0"):
        h = jnp.tanh(batch["x"] @ params["w0"])
    with client.layer("head"):
        return jnp.mean((h @ params["w1"]) ** 2)


def main() -> None:
    params = {"w0": jnp.ones((8, 8)), "w1": jnp.ones((8, 8))}
    spec = client.trace(loss_fn, params, {"x": jnp.ones((4, 8))}, name="tiny_mlp")
    doc = spec.model_dump(mode="json")
    for layer in doc["layers"]:
        layer["fingerprint"] = ""  # the server computes it
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
