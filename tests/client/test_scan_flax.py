"""Flax layer stacks written with scans (linen `nn.scan`, NNX `nnx.vmap` + `nnx.scan`) trace
into one layer per block, as their unrolled versions do."""

import json
import os
import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import client
from schemas import DTYPE_BYTES, LayerSpec
from tests.client.helpers import assert_roundtrip
from tests.support.plan_layers import assert_every_layer_planned

D, L = 16, 3  # hidden, blocks


class Block(nn.Module):
    """An MLP block in the scan signature `(carry, x) -> (carry, y)`."""

    @nn.compact
    def __call__(self, x: jax.Array, _: None) -> tuple[jax.Array, None]:
        h = nn.Dense(2 * D, name="up")(nn.LayerNorm(name="norm")(x))
        return x + nn.Dense(D, name="down")(nn.gelu(h)), None


class Model(nn.Module):
    scanned: bool

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Dense(D, name="embed")(x)
        block = nn.remat(Block, prevent_cse=not self.scanned)
        if self.scanned:  # as MaxText stacks its decoder layers: the layer axis is axis 1
            stack = nn.scan(
                block,
                variable_axes={"params": 1},
                split_rngs={"params": True},
                length=L,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, _ = stack(name="layers")(x, None)
        else:
            for i in range(L):
                x, _ = block(name=f"layers_{i}")(x, None)
        return jnp.mean(nn.Dense(4, name="head")(x) ** 2)


def _bytes(vs: list) -> int:
    return sum(DTYPE_BYTES[v.dtype] * int(jnp.prod(jnp.array(v.shape))) for v in vs)


def _costs(layer: LayerSpec) -> tuple[float, int, int]:
    return layer.flops, _bytes(layer.residuals), _bytes(layer.params)


@pytest.fixture(scope="module")
def linen() -> tuple:
    x = jax.random.normal(jax.random.key(1), (2, D))
    specs, params = {}, {}
    for scanned in (True, False):
        model = Model(scanned)
        params[scanned] = model.init(jax.random.key(0), x)
        specs[scanned] = client.trace(
            lambda p, b, m=model: m.apply(p, b["x"]), params[scanned], {"x": x}
        )
    return specs, params, {"x": x}


def test_linen_scan_with_layer_axis_1_is_a_layer_per_block(linen) -> None:
    specs, params, batch = linen
    spec = specs[True]
    names = ["embed", *(f"layers/{i}" for i in range(L)), "head"]
    assert [layer.name for layer in spec.layers] == names
    assert params[True]["params"]["layers"]["up"]["kernel"].shape == (D, L, 2 * D)
    kernel = {p.name: p.shape for p in spec.layers[2].params}["params/layers/up/kernel[1]"]
    assert kernel == (D, 2 * D)
    assert len({layer.fingerprint for layer in spec.layers[1:-1]}) == 1
    model = Model(True)
    stacked = {
        f"params/layers/{m}/{w}": 1
        for m, w in [
            ("up", "kernel"),
            ("up", "bias"),
            ("down", "kernel"),
            ("down", "bias"),
            ("norm", "scale"),
            ("norm", "bias"),
        ]
    }
    assert_roundtrip(
        spec, lambda p, b: model.apply(p, b["x"]), params[True], batch, cuts=(2,), stacked=stacked
    )


def test_linen_scanned_and_unrolled_stages_cost_the_same(linen) -> None:
    specs, _, _ = linen
    scanned, unrolled = specs[True], specs[False]
    assert [layer.name for layer in unrolled.layers][1:-1] == [f"layers_{i}" for i in range(L)]
    assert len(scanned.layers) == len(unrolled.layers)
    for a, b in zip(scanned.layers, unrolled.layers, strict=True):
        assert _costs(a) == _costs(b), (a.name, b.name)
    assert "remat" in scanned.layers[1].jaxpr or "checkpoint" in scanned.layers[1].jaxpr


class NnxBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.norm = nnx.LayerNorm(D, rngs=rngs)
        self.linear = nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + nnx.gelu(self.linear(self.norm(x)))


class NnxModel(nnx.Module):
    """Blocks made and run as the Flax NNX guide does: `nnx.vmap` to stack, `nnx.scan`."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Linear(D, D, rngs=rngs)

        @nnx.split_rngs(splits=L)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def create_block(rngs: nnx.Rngs) -> NnxBlock:
            return NnxBlock(rngs)

        self.blocks = create_block(rngs)
        self.head = nnx.Linear(D, 4, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def forward(x: jax.Array, block: NnxBlock) -> jax.Array:
            return block(x)

        return self.head(forward(self.embed(x), self.blocks))


def test_nnx_vmap_and_scan_blocks_are_layers() -> None:
    graphdef, params = nnx.split(NnxModel(nnx.Rngs(0)), nnx.Param)
    batch = {"x": jax.random.normal(jax.random.key(1), (2, D))}

    def loss(p: nnx.State, b: dict[str, jax.Array]) -> jax.Array:
        return jnp.mean(nnx.merge(graphdef, p)(b["x"]) ** 2)

    spec = client.trace(loss, params, batch)
    names = ["embed", *(f"blocks/{i}" for i in range(L)), "head"]
    assert [layer.name for layer in spec.layers] == names
    assert {p.name for p in spec.layers[1].params} == {
        f"blocks/{m}/{w}/value[0]"
        for m, w in [("norm", "scale"), ("norm", "bias"), ("linear", "kernel"), ("linear", "bias")]
    }
    assert len({layer.fingerprint for layer in spec.layers[1:-1]}) == 1
    stacked = {p.name.split("[")[0]: 0 for p in spec.layers[1].params}
    assert_roundtrip(spec, loss, params, batch, cuts=(2, 3), stacked=stacked)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_maxtext_decoder_example_plans_through_stageprof_plan(tmp_path: Path) -> None:
    """examples/maxtext_decoder.py traces a scanned decoder; `stageprof plan --model` plans it."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, STAGEPROF_DATABASE_URL=f"sqlite:///{tmp_path / 'plan.db'}")
    env.pop("RAY_ADDRESS", None)
    spec_path = tmp_path / "spec.json"
    example = [str(root / "examples" / "maxtext_decoder.py"), "--layers", "2", "--hidden", "32"]
    traced = subprocess.run(
        [sys.executable, *example, "--trace-only", "--spec", str(spec_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert traced.returncode == 0, traced.stderr[-3000:]
    assert [line.split()[1] for line in traced.stdout.splitlines()[1:3]] == ["layers/0", "layers/1"]
    fast = ["--config-space", "data_parallel_only", "--strategies", "data", "--repeats", "2"]
    planned = subprocess.run(
        [sys.executable, "-m", "cli", "plan", "--model", str(spec_path), *fast]
        + ["--hosts", "1", "--devices-per-host", "2", "--micro-batches", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=800,
        env=env,
        cwd=root,
    )
    assert planned.returncode == 0, planned.stderr[-3000:]
    plan = json.loads(planned.stdout.strip().splitlines()[-1])["plan"]
    assert_every_layer_planned(plan, ["token_embedder", "layers/0", "layers/1", "decoder_norm"])
