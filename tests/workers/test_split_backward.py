"""The backward split into B (input cotangents) and W (weight gradients) on a traced GPT block:
same FLOPs as the backward, same results as the backward and as `jax.vjp` of the un-exported
block, and measured as two more modules only when the schedule needs them."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from client import zoo
from client.zoo import transformer as tf
from schemas import (
    ClusterSpec,
    ModelSpec,
    ModuleKind,
    PlanOptions,
    ShardingConfig,
    StageKey,
    SubmeshShape,
)
from workers.measure import measure_stage
from workers.measure.compose import compose_stage
from workers.measure.compose_split import compose_split_backward
from workers.measure.fingerprint import stage_fingerprint

HIDDEN, HEADS, SEQ, BATCH, VOCAB = 16, 2, 4, 2, 32
BLOCK, HEAD = 1, 3  # layers: embed, block0, block1, head
ONE = SubmeshShape(hosts=1, devices_per_host=1)
DATA = ShardingConfig(logical_mesh=(1, 1), strategy="data")
CLUSTER = ClusterSpec(num_hosts=1, devices_per_host=1, device_kind="cpu")


@pytest.fixture(scope="module")
def gpt() -> ModelSpec:
    return zoo.build(
        "gpt",
        num_layers=2,
        hidden_size=HIDDEN,
        num_heads=HEADS,
        seq_len=SEQ,
        vocab_size=VOCAB,
        batch_size=BATCH,
    )


def _values(structs: list, seed: int) -> list[jax.Array]:
    keys = jax.random.split(jax.random.key(seed), len(structs))
    return [
        0.3 * jax.random.normal(k, s.shape, s.dtype) for k, s in zip(keys, structs, strict=True)
    ]


def _flops(fn: object, *args: object) -> float:
    """FLOPs of the lowered (not yet optimized) program: what the equations compute, before
    XLA's fusion copies cheap producers into several consumers."""
    return float(jax.jit(fn).lower(*args).cost_analysis()["flops"])  # type: ignore[arg-type]


def _dots(fn: object, *args: object) -> int:
    return len(re.findall(r"\bdot\(", jax.jit(fn).lower(*args).as_text(dialect="hlo")))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def block_stage(gpt: ModelSpec) -> dict:
    """Two blocks and the head (its loss) as one stage: forward once, then backward, B and W
    on the same stash."""
    program = compose_stage(gpt, BLOCK, HEAD)
    split = compose_split_backward(gpt, BLOCK, HEAD, program)
    params = _values(program.params, 0)
    x = _values(program.inputs[:1], 1)[0]
    labels = jax.random.randint(jax.random.key(2), (BATCH, SEQ), 0, VOCAB)
    inputs = [x, labels]
    outs, stash = jax.jit(program.forward)(params, inputs)
    cot = (jnp.ones_like(outs[0]),)
    grads, xgrads = jax.jit(program.backward)(params, stash, cot)
    b_xgrads, handoff = jax.jit(split.input_grad)(params, stash, cot)
    w_grads = jax.jit(split.weight_grad)(params, stash, handoff)
    return dict(
        program=program,
        split=split,
        params=params,
        inputs=inputs,
        stash=stash,
        cot=cot,
        grads=grads,
        xgrads=xgrads,
        b_xgrads=b_xgrads,
        handoff=handoff,
        w_grads=w_grads,
    )


def test_b_plus_w_flops_equal_the_backward(block_stage: dict) -> None:
    s = block_stage
    args = (s["params"], s["stash"], s["cot"])
    backward = _flops(s["program"].backward, *args)
    b = _flops(s["split"].input_grad, *args)
    w = _flops(s["split"].weight_grad, s["params"], s["stash"], s["handoff"])
    assert b > 0 and w > 0
    assert b + w == backward
    # every dot of the backward is in exactly one of B and W, and W has some
    dots = _dots(s["program"].backward, *args)
    w_dots = _dots(s["split"].weight_grad, s["params"], s["stash"], s["handoff"])
    assert 0 < w_dots < dots
    assert _dots(s["split"].input_grad, *args) + w_dots == dots


def test_split_equals_the_backward(block_stage: dict) -> None:
    s = block_stage
    for ours, ref in zip(s["b_xgrads"], s["xgrads"], strict=True):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
    for ours, ref in zip(s["w_grads"], s["grads"], strict=True):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def test_split_equals_jax_vjp_of_the_unexported_layers(block_stage: dict) -> None:
    s = block_stage
    names = [p.name for p in s["program"].params]

    def loss(flat: list[jax.Array], x: jax.Array, labels: jax.Array) -> jax.Array:
        by_name = dict(zip(names, flat, strict=True))

        def scope(prefix: str) -> dict:
            return {n[len(prefix) :]: v for n, v in by_name.items() if n.startswith(prefix)}

        for i in (0, 1):
            bp = scope(f"blocks/{i}/")
            x = tf.mlp(bp, tf.attention(bp, x, HEADS))
        return tf.lm_loss(scope("head/"), x, labels)

    grads, xgrad = jax.jit(jax.grad(loss, argnums=(0, 1)))(s["params"], *s["inputs"])
    np.testing.assert_allclose(s["b_xgrads"][0], xgrad, rtol=1e-4, atol=1e-6)
    for ours, ref in zip(s["w_grads"], grads, strict=True):
        np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-6)


def test_b_does_not_depend_on_w(block_stage: dict) -> None:
    """B alone gives the input cotangents; W reads nothing but the parameters, the stash and
    B's handoff, and its outputs are the parameter gradients only."""
    s = block_stage
    split = s["split"]
    b_jaxpr = jax.make_jaxpr(split.input_grad)(s["params"], s["stash"], s["cot"])
    w_out = jax.eval_shape(split.weight_grad, s["params"], s["stash"], s["handoff"])
    assert [o.shape for o in w_out] == [p.shape for p in s["program"].params]
    assert len(b_jaxpr.out_avals) == len(s["xgrads"]) + len(s["handoff"])
    assert len(split.handoff_names) == len(s["handoff"])


def _measure(gpt: ModelSpec, schedule: str, end: int) -> object:
    options = PlanOptions(repeats=1, max_repeats=1, warmup=0, prune=False, schedule=schedule)
    return measure_stage(
        gpt, StageKey(start=0, end=end, submesh_id=0, config_id=0), CLUSTER, options
    )


def test_measure_stage_zb_h1_has_b_and_w(gpt: ModelSpec) -> None:
    """The embedding (no input cotangent: W is its whole backward) and a block."""
    r = _measure(gpt, "zb-h1", BLOCK)
    assert r.ok, r.error  # type: ignore[attr-defined]
    kinds = [m.module for m in r.module_profile_results]  # type: ignore[attr-defined]
    assert kinds[-2:] == [ModuleKind.backward_input, ModuleKind.backward_weight]
    b = r.module(ModuleKind.backward_input)  # type: ignore[attr-defined]
    w = r.module(ModuleKind.backward_weight)  # type: ignore[attr-defined]
    assert b.compute_cost > 0 and w.compute_cost > 0 and b.flops > 0 and w.flops > 0
    assert r.input_grad_cost == b.compute_cost and r.weight_grad_cost == w.compute_cost  # type: ignore[attr-defined]
    assert r.weight_stash_size > 0  # type: ignore[attr-defined]
    assert r.weight_stash_size == sum(  # type: ignore[attr-defined]
        size
        for name, size in zip(b.outvar_names, b.outvar_sizes, strict=True)
        if name.startswith("handoff:")
    )
    fwd, bwd = r.module(ModuleKind.forward), r.module(ModuleKind.backward)  # type: ignore[attr-defined]
    assert r.flops == fwd.flops + bwd.flops  # type: ignore[attr-defined]


def test_measure_stage_1f1b_has_no_split(gpt: ModelSpec) -> None:
    r = _measure(gpt, "1f1b", 0)
    assert r.ok, r.error  # type: ignore[attr-defined]
    kinds = {m.module for m in r.module_profile_results}  # type: ignore[attr-defined]
    assert kinds == {ModuleKind.forward, ModuleKind.backward, ModuleKind.apply_grad}
    assert r.weight_stash_size == 0  # type: ignore[attr-defined]
    assert r.input_grad_cost == float("inf")  # type: ignore[attr-defined]


def test_fingerprint_tells_the_split_apart_and_names_its_twin(gpt: ModelSpec) -> None:
    def fp(schedule: str, split: bool | None = None) -> str:
        options = PlanOptions(schedule=schedule)
        return stage_fingerprint(gpt, BLOCK, BLOCK, ONE, DATA, "cpu", "0", options, split)

    assert fp("zb-h1") == fp("auto")  # both measure the split
    assert fp("1f1b") == fp("gpipe") == fp("interleaved")  # none does
    assert fp("1f1b") != fp("zb-h1")
    # a job without the split may reuse the split measurement: its twin
    assert fp("1f1b", True) == fp("zb-h1")
    assert fp("zb-h1", False) == fp("1f1b")
