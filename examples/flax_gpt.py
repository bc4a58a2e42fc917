"""A Flax (linen) GPT, traced into layers with no markers and planned by a stageprof server.

    .venv/bin/python examples/flax_gpt.py                      # start a local server + worker
    .venv/bin/python examples/flax_gpt.py --server http://127.0.0.1:8000
    .venv/bin/python examples/flax_gpt.py --trace-only --blocks 8

Needs Flax: `pip install 'stageprof[flax]'`. The model is written as a user writes it; the
tracer makes one layer per block `h_i` and one each for what comes before them (embeddings)
and after them (final norm, head and loss). Without `--server` it starts `stageprof serve` and
`stageprof worker` on a fresh SQLite file in a temporary directory and stops them at the end.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import flax.linen as nn
import httpx
import jax
import jax.numpy as jnp
import optax

import client
from client.sdk import StageprofClient
from schemas import ClusterSpec, JobStatus, PlanOptions

VOCAB, SEQ, BATCH = 256, 32, 8  # BATCH: one micro-batch


class Block(nn.Module):
    """A pre-norm GPT-2 block: causal self-attention, then an MLP."""

    hidden: int
    heads: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
        y = nn.LayerNorm(name="ln_1")(x)
        x = x + nn.MultiHeadDotProductAttention(self.heads, name="attn")(y, mask=mask)
        y = nn.Dense(4 * self.hidden, name="fc")(nn.LayerNorm(name="ln_2")(x))
        return x + nn.Dense(self.hidden, name="proj")(nn.gelu(y))


class GPT(nn.Module):
    num_blocks: int
    hidden: int
    heads: int

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        pos = jnp.arange(tokens.shape[1])
        x = nn.Embed(VOCAB, self.hidden, name="wte")(tokens)
        x = x + nn.Embed(SEQ, self.hidden, name="wpe")(pos)
        for i in range(self.num_blocks):
            x = Block(self.hidden, self.heads, name=f"h_{i}")(x)
        return nn.Dense(VOCAB, name="lm_head")(nn.LayerNorm(name="ln_f")(x))


def build(num_blocks: int, hidden: int) -> tuple:
    """The model's loss function, parameters and one micro-batch."""
    model = GPT(num_blocks=num_blocks, hidden=hidden, heads=max(1, hidden // 32))
    tokens = jax.random.randint(jax.random.key(1), (BATCH, SEQ + 1), 0, VOCAB)
    batch = {"x": tokens[:, :-1], "y": tokens[:, 1:]}
    params = model.init(jax.random.key(0), batch["x"])

    def loss_fn(params: dict, batch: dict[str, jax.Array]) -> jax.Array:
        logits = model.apply(params, batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    return loss_fn, params, batch


def _stageprof() -> list[str]:
    script = Path(sys.executable).with_name("stageprof")
    return [str(script)] if script.exists() else [sys.executable, "-m", "cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def local_server(devices: int) -> Iterator[str]:
    """`stageprof serve` and `stageprof worker` on a fresh SQLite store; yields the URL."""
    with tempfile.TemporaryDirectory(prefix="stageprof-flax-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STAGEPROF_")}
        env["STAGEPROF_DATABASE_URL"] = f"sqlite:///{tmp}/stageprof.db"
        env.pop("RAY_ADDRESS", None)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        subprocess.run([*_stageprof(), "db", "upgrade"], env=env, check=True, capture_output=True)
        commands = {
            "serve": ["serve", "--host", "127.0.0.1", "--port", str(port), "--no-migrate"],
            "worker": ["worker", "--workers", "1", "--devices-per-worker", str(devices)]
            + ["--idle-sleep", "0.5"],
        }
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for name, args in commands.items():
                with open(f"{tmp}/{name}.log", "wb") as log:
                    cmd = [*_stageprof(), *args]
                    procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=log))
            _wait_healthy(url, procs)
            yield url
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _wait_healthy(url: str, procs: list[subprocess.Popen[bytes]], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("the local server or worker exited; see its log")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{url} did not become healthy in {timeout_s} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4, help="transformer blocks")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size")
    parser.add_argument("--devices", type=int, default=2, help="devices of the one host")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--server", metavar="URL", help="a running stageprof server")
    parser.add_argument("--trace-only", action="store_true", help="trace and stop")
    args = parser.parse_args(argv)

    loss_fn, params, batch = build(args.blocks, args.hidden)
    spec = client.trace(loss_fn, params, batch, name="flax_gpt")
    for i, layer in enumerate(spec.layers):
        print(f"{i}: {layer.name:8s} {layer.flops / 1e6:8.2f} MFLOP  {layer.fingerprint[:12]}")
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
            print(f"{kind} {layers:16s} on {shape}  {stage.compute_cost * 1e3:7.2f} ms")
    print(f"predicted iteration {plan.predicted_iteration_time_s * 1e3:.2f} ms")
    return 0


@contextmanager
def _given(url: str) -> Iterator[str]:
    yield url


if __name__ == "__main__":
    sys.exit(main())
