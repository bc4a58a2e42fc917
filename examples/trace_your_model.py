"""Trace your own JAX model into a stageprof `ModelSpec`, check it, and (optionally) submit it.

    .venv/bin/python examples/trace_your_model.py                 # trace, check, write JSON
    .venv/bin/python examples/trace_your_model.py --auto 3        # cluster into 3 layers
    .venv/bin/python examples/trace_your_model.py --submit http://localhost:8000

Mark layers with `client.layer("name")` (a `jax.named_scope`); everything the loss computes
must be a function of the params and the batch. Params may be `jax.ShapeDtypeStruct`s, so a
model too big for this machine can be traced without allocating it.
"""

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import client

HIDDEN, BATCH = 256, 32


def init(key: jax.Array) -> dict:
    k = jax.random.split(key, 4)
    dense = lambda kk, i, o: jax.random.normal(kk, (i, o)) / np.sqrt(i)  # noqa: E731
    return {
        "embed": {"w": dense(k[0], 64, HIDDEN)},
        "block1": {"w": dense(k[1], HIDDEN, HIDDEN), "b": jnp.zeros(HIDDEN)},
        "block2": {"w": dense(k[2], HIDDEN, HIDDEN), "b": jnp.zeros(HIDDEN)},
        "head": {"w": dense(k[3], HIDDEN, 10)},
    }


def loss_fn(params: dict, batch: dict[str, jax.Array]) -> jax.Array:
    """A residual MLP classifier; block2 also reads embed's output (a skip connection)."""
    with client.layer("embed"):
        h0 = jnp.tanh(batch["x"] @ params["embed"]["w"])
    with client.layer("block1"):
        h1 = h0 + jax.nn.gelu(h0 @ params["block1"]["w"] + params["block1"]["b"])
    with client.layer("block2"):
        h2 = h1 + h0 + jax.nn.gelu(h1 @ params["block2"]["w"] + params["block2"]["b"])
    with client.layer("head"):
        logp = jax.nn.log_softmax(h2 @ params["head"]["w"])
        return -jnp.mean(jnp.take_along_axis(logp, batch["label"][:, None], axis=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--auto", type=int, help="cluster into this many layers by FLOPs")
    parser.add_argument("--out", type=Path, default=Path("my_model.json"))
    parser.add_argument("--submit", metavar="URL", help="store the spec on a stageprof server")
    args = parser.parse_args(argv)

    params = init(jax.random.key(0))
    batch = {  # one micro-batch
        "x": jax.random.normal(jax.random.key(1), (BATCH, 64)),
        "label": jax.random.randint(jax.random.key(2), (BATCH,), 0, 10),
    }
    spec = client.trace(loss_fn, params, batch, layers=args.auto, name="residual_mlp")
    for i, layer in enumerate(spec.layers):
        ins = ", ".join(v.name for v in layer.inputs)
        kept = sum(r.size_bytes for r in layer.residuals) / 1e3
        print(
            f"{i}: {layer.name:8s} {layer.flops / 1e6:8.2f} MFLOP  keeps {kept:7.1f} kB  in: {ins}"
        )

    # The layers, deserialized and composed, give back the loss (what a worker does).
    from client.tracing import path_name
    from workers.measure.compose import check_programs, compose_stage

    assert check_programs(spec) == []
    stage = compose_stage(spec, 0, spec.num_layers - 1)
    named = {path_name(p): v for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}
    (loss,) = stage.fn([named[p.name] for p in stage.params], [batch[v.name] for v in stage.inputs])
    print(f"loss {float(loss):.6f} (direct: {float(loss_fn(params, batch)):.6f})")

    args.out.write_text(json.dumps(spec.model_dump(mode="json")))
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB)")
    if args.submit:
        from client.sdk import StageprofClient

        with StageprofClient(args.submit) as api:
            print(f"stored as model {api.put_model(spec).id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
