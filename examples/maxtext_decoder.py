"""A decoder written as MaxText writes its decoder, traced into layers and planned.

    .venv/bin/python examples/maxtext_decoder.py                   # local server + worker
    .venv/bin/python examples/maxtext_decoder.py --trace-only --spec spec.json
    stageprof plan --model spec.json --hosts 1 --devices-per-host 2

The decoder layers are stacked with `nn.scan` as MaxText's `scan_layers: true` stacks them
(`Decoder.scan_decoder_layers` in AI-Hypercomputer/maxtext `src/MaxText/layers/decoders.py`,
commit 6c01933c4259c73bbfc13cbe543103bbcc045ba5): `variable_axes={"params": param_scan_axis}`
with `param_scan_axis: 1` (the layer axis of every stacked parameter is axis 1),
`split_rngs={"params": True, "dropout": enable_dropout}`, the positions broadcast to every
layer, `metadata_params={nn.PARTITION_NAME: "layers"}`, and each layer wrapped in `nn.remat`
with a checkpoint policy (MaxText's `remat_policy: minimal` saves the dots without batch
dimensions). The tracer makes one layer per decoder layer, `layers/0 .. layers/N-1`, whose
parameters are the slices `.../layers/.../kernel[i]` with their logical axes minus `layers`;
the decoder layer's programs are exported once and shared by every layer.
"""

import argparse
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import client
from client.sdk import StageprofClient
from client.tracing import path_name
from schemas import ClusterSpec, JobStatus, PlanOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))
from flax_gpt import local_server  # noqa: E402

VOCAB, SEQ, BATCH = 256, 32, 8  # BATCH: one micro-batch


def _dense(features: int, axes: tuple[str, str], name: str) -> nn.Dense:
    init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), axes)
    return nn.Dense(features, use_bias=False, kernel_init=init, name=name)


class RMSNorm(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.with_logical_partitioning(nn.initializers.ones, ("norm",))
        scale = self.param("scale", init, (x.shape[-1],))
        assert isinstance(scale, jax.Array)  # unboxed: `param` strips the logical axes
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


class DecoderLayer(nn.Module):
    """A llama-style layer in MaxText's scanned signature: `(x, positions) -> (x, None)`."""

    hidden: int
    heads: int

    @nn.compact
    def __call__(self, x: jax.Array, positions: jax.Array) -> tuple[jax.Array, None]:
        b, t, d = x.shape
        h, k = self.heads, d // self.heads
        y = RMSNorm(name="pre_self_attention_layer_norm")(x)
        q, kk, v = (
            _dense(d, ("embed", "heads"), n)(y).reshape(b, t, h, k)
            for n in ("query", "key", "value")
        )
        mask = positions[:, None] >= positions[None, :]
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, kk) / jnp.sqrt(k)
        attn = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", attn, v).reshape(b, t, d)
        x = x + _dense(d, ("heads", "embed"), "out")(out)
        y = RMSNorm(name="post_self_attention_layer_norm")(x)
        gate = _dense(4 * d, ("embed", "mlp"), "wi_0")(y)
        up = _dense(4 * d, ("embed", "mlp"), "wi_1")(y)
        return x + _dense(d, ("mlp", "embed"), "wo")(nn.silu(gate) * up), None


class Decoder(nn.Module):
    num_layers: int
    hidden: int
    heads: int
    param_scan_axis: int = 1

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        embed_init = nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed"))
        embedding = nn.Embed(VOCAB, self.hidden, embedding_init=embed_init, name="token_embedder")
        x = embedding(tokens)
        positions = jnp.arange(tokens.shape[1])
        layer = nn.remat(
            DecoderLayer,
            prevent_cse=False,  # MaxText: `not scan_layers`
            policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        )
        stack = nn.scan(
            layer,
            variable_axes={"params": self.param_scan_axis},
            split_rngs={"params": True, "dropout": False},
            in_axes=(nn.broadcast,),
            length=self.num_layers,
            metadata_params={nn.PARTITION_NAME: "layers"},
        )
        x, _ = stack(self.hidden, self.heads, name="layers")(x, positions)
        x = RMSNorm(name="decoder_norm")(x)
        return _dense(VOCAB, ("embed", "vocab"), "logits_dense")(x)


def build(num_layers: int, hidden: int) -> tuple:
    """The loss, unboxed parameters, their logical axes and one micro-batch."""
    model = Decoder(num_layers=num_layers, hidden=hidden, heads=max(1, hidden // 32))
    tokens = jax.random.randint(jax.random.key(1), (BATCH, SEQ + 1), 0, VOCAB)
    batch = {"x": tokens[:, :-1], "y": tokens[:, 1:]}
    boxed = model.init(jax.random.key(0), batch["x"])
    specs = nn.get_partition_spec(boxed)
    params = nn.unbox(boxed)
    axes = {
        path_name(path): tuple(spec)
        for path, spec in jax.tree_util.tree_flatten_with_path(
            specs, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec)
        )[0]
    }

    def loss_fn(params: dict, batch: dict[str, jax.Array]) -> jax.Array:
        logits = model.apply(params, batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    return loss_fn, params, axes, batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size")
    parser.add_argument("--devices", type=int, default=2, help="devices of the one host")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--server", metavar="URL", help="a running stageprof server")
    parser.add_argument("--spec", type=Path, help="write the traced ModelSpec JSON here")
    parser.add_argument("--trace-only", action="store_true", help="trace and stop")
    args = parser.parse_args(argv)

    loss_fn, params, axes, batch = build(args.layers, args.hidden)
    spec = client.trace(loss_fn, params, batch, name="maxtext_decoder", logical_axes=axes)
    for i, layer in enumerate(spec.layers):
        print(f"{i}: {layer.name:14s} {layer.flops / 1e6:8.2f} MFLOP  {layer.fingerprint[:12]}")
    if args.spec is not None:
        args.spec.write_text(spec.model_dump_json())
    if args.trace_only:
        return 0

    cluster = ClusterSpec(num_hosts=1, devices_per_host=args.devices)
    options = PlanOptions(
        num_microbatches=args.micro_batches, strategies=["data"], repeats=2, warmup=1
    )
    with local_server(args.devices) if args.server is None else _given(args.server) as url:
        with StageprofClient(url) as api:
            ref = api.submit_plan(model=spec, cluster=cluster, options=options)
            job = api.wait_for_job(ref.job_id, timeout_s=900, poll_s=0.5)
            if job.status != JobStatus.done:
                print(f"job {job.id} {job.status}: {job.error}", file=sys.stderr)
                return 1
            plan = api.get_plan(job.id)
    print(f"job {job.id}: {job.progress.measured} stages measured, {job.progress.reused} reused")
    # layers kept outside the pipeline (on every device, MaxText-style), then the stages
    for kind, stages in (("outside", plan.outside), ("stage", plan.stages)):
        for stage in stages:
            layers = f"{stage.layer_names[0]}..{stage.layer_names[-1]}"
            shape = f"{stage.submesh.hosts}x{stage.submesh.devices_per_host}"
            print(f"{kind} {layers:24s} on {shape}  {stage.compute_cost * 1e3:7.2f} ms")
    print(f"predicted iteration {plan.predicted_iteration_time_s * 1e3:.2f} ms")
    return 0


class _given:  # noqa: N801 - a context manager for a server that is already running
    def __init__(self, url: str) -> None:
        self.url = url

    def __enter__(self) -> str:
        return self.url

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())
