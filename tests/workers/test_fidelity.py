"""What a stage measures is a real training step's: the stash equals `jax.vjp`'s residuals,
the backward does not re-run the forward, remat is honoured, the CPU peak has temporaries.

The reference is always a direct `jax.vjp` of the un-exported Python function."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import client
from schemas import ClusterSpec, ModuleKind, PlanOptions, ShardingConfig, SubmeshShape
from workers.measure.stage import measure_stage_on

HIDDEN, FFN, BATCH, BLOCKS = 32, 64, 8, 2
ONE_DEVICE = SubmeshShape(hosts=1, devices_per_host=1)
DATA = ShardingConfig(logical_mesh=(1, 1), strategy="data")
CLUSTER = ClusterSpec(num_hosts=1, devices_per_host=1, device_kind="cpu")
OPTIONS = PlanOptions(repeats=2, max_repeats=2, warmup=1, prune=False, schedule="1f1b")


def _block(p: dict, h: jax.Array) -> jax.Array:
    return h + jnp.tanh(jnp.tanh(h @ p["w1"]) @ p["w2"])


def _loss_fn(remat: bool) -> Callable[[Any, Any], jax.Array]:
    block = jax.checkpoint(_block) if remat else _block

    def loss(params: dict, batch: dict) -> jax.Array:
        with client.layer("embed"):
            h = batch["x"] @ params["w_in"]
        for i in range(BLOCKS):
            with client.layer(f"block{i}"):
                h = block(params[f"b{i}"], h)
        with client.layer("head"):
            return jnp.mean((h - batch["y"]) ** 2)

    return loss


def _params() -> dict:
    keys = jax.random.split(jax.random.key(0), 2 * BLOCKS + 1)
    return {"w_in": jax.random.normal(keys[-1], (HIDDEN, HIDDEN)) * 0.1} | {
        f"b{i}": {
            "w1": jax.random.normal(keys[2 * i], (HIDDEN, FFN)) * 0.1,
            "w2": jax.random.normal(keys[2 * i + 1], (FFN, HIDDEN)) * 0.1,
        }
        for i in range(BLOCKS)
    }


def _batch() -> dict:
    return {"x": jnp.ones((BATCH, HIDDEN)) * 0.5, "y": jnp.zeros((BATCH, HIDDEN))}


def direct_vjp(loss: Callable, params: dict, batch: dict) -> tuple[int, float]:
    """Residual bytes (unique non-parameter VJP leaves) and backward FLOPs of `jax.vjp` of
    the un-exported loss, with the VJP carried from one jitted program into another."""
    tree: list[Any] = []

    def forward(p: dict, b: dict) -> list[jax.Array]:
        _, vjp = jax.vjp(lambda q: loss(q, b), p)
        leaves, treedef = jax.tree_util.tree_flatten(vjp)
        tree.append(treedef)
        return leaves

    leaves = jax.jit(forward)(params, batch)
    param_ids = {id(x) for x in jax.tree_util.tree_leaves(params)}
    residual = {id(x): x for x in leaves if id(x) not in param_ids}
    nbytes = sum(x.size * x.dtype.itemsize for x in residual.values())

    def backward(leaves: list[jax.Array]) -> Any:
        return jax.tree_util.tree_unflatten(tree[0], leaves)(jnp.ones((), jnp.float32))

    flops = jax.jit(backward).lower(leaves).compile().cost_analysis()["flops"]
    return nbytes, float(flops)


def _residual_bytes_without_params(loss: Callable, params: dict, batch: dict) -> int:
    """Residual bytes where parameters passed as plain leaves are recognised by value."""
    _, vjp = jax.vjp(lambda q: loss(q, batch), params)
    params_leaves = jax.tree_util.tree_leaves(params)
    seen: dict[int, jax.Array] = {}
    for leaf in jax.tree_util.tree_leaves(vjp):
        if any(leaf is p for p in params_leaves):
            continue
        seen.setdefault(id(leaf), leaf)
    return sum(x.size * x.dtype.itemsize for x in seen.values())


@pytest.fixture(scope="module")
def measured() -> dict[bool, tuple[Any, Any]]:
    out = {}
    for remat in (False, True):
        spec = client.trace(_loss_fn(remat), _params(), _batch(), name=f"remat{int(remat)}")
        assert [layer.name for layer in spec.layers] == ["embed", "block0", "block1", "head"]
        result = measure_stage_on(spec, 0, spec.num_layers - 1, ONE_DEVICE, DATA, CLUSTER, OPTIONS)
        assert result.ok, result.error
        out[remat] = (spec, result)
    return out


@pytest.mark.parametrize("remat", [False, True])
def test_stash_equals_direct_vjp_residuals(measured: dict, remat: bool) -> None:
    _, result = measured[remat]
    expected = _residual_bytes_without_params(_loss_fn(remat), _params(), _batch())
    assert result.intermediate_size == expected


@pytest.mark.parametrize("remat", [False, True])
def test_backward_does_not_rerun_the_forward(measured: dict, remat: bool) -> None:
    _, result = measured[remat]
    _, direct_flops = direct_vjp(_loss_fn(remat), _params(), _batch())
    backward = result.module_profile_results[1]
    assert backward.module.value == "backward"
    assert backward.flops <= 1.05 * direct_flops
    assert backward.flops >= 0.95 * direct_flops


def test_remat_stashes_less_and_recomputes(measured: dict) -> None:
    plain, remat = measured[False][1], measured[True][1]
    assert remat.intermediate_size < plain.intermediate_size
    assert remat.module_profile_results[1].flops > plain.module_profile_results[1].flops
    assert remat.fingerprint != plain.fingerprint
    plain_spec, remat_spec = measured[False][0], measured[True][0]
    assert plain_spec.layers[1].fingerprint != remat_spec.layers[1].fingerprint


def test_cpu_peak_counts_temporaries(measured: dict) -> None:
    _, result = measured[False]
    backward = result.module(ModuleKind.backward)
    assert backward is not None and backward.temp_buffer_size > 0
    for m in result.module_profile_results:
        donated = sum(s for s, d in zip(m.invar_sizes, m.donated_invars, strict=True) if d)
        floor = sum(m.invar_sizes) + sum(m.outvar_sizes) - donated + m.temp_buffer_size
        assert m.peak_memory >= floor, m.module


def test_identical_blocks_share_a_fingerprint(measured: dict) -> None:
    spec, _ = measured[False]
    block0, block1 = spec.layers[1], spec.layers[2]
    assert block0.fingerprint == block1.fingerprint
    assert block0.residuals == block1.residuals and block0.residuals
    assert block0.forward == block1.forward and block0.backward == block1.backward
