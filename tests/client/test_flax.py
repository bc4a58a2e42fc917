"""client.trace on Flax models: linen and NNX blocks become layers, with no markers."""

import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import client
from client.scopes import Level, choose_level, level_segments
from tests.client.helpers import assert_roundtrip, by_name, composed_loss_and_grads

D, V, T, N = 32, 64, 8, 3  # hidden, vocab, sequence, blocks


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        x = x + nn.MultiHeadDotProductAttention(num_heads=2, name="attn")(
            nn.LayerNorm(name="ln_1")(x), mask=mask
        )
        h = nn.Dense(2 * D, name="fc")(nn.LayerNorm(name="ln_2")(x))
        return x + nn.Dense(D, name="proj")(nn.gelu(h))


class GPT(nn.Module):
    num_blocks: int = N
    remat: bool = False

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        wte = nn.Embed(V, D, name="wte")
        x = wte(tokens) + self.param("wpe", nn.initializers.normal(0.02), (T, D))
        block = nn.remat(Block) if self.remat else Block
        for i in range(self.num_blocks):
            x = block(name=f"h_{i}")(x)
        return wte.attend(nn.LayerNorm(name="ln_f")(x))


def linen_setup(model: nn.Module) -> tuple:
    batch = {
        "x": jax.random.randint(jax.random.key(1), (2, T), 0, V),
        "y": jax.random.randint(jax.random.key(2), (2, T), 0, V),
    }
    params = model.init(jax.random.key(0), batch["x"])

    def loss(p: dict, b: dict[str, jax.Array]) -> jax.Array:
        logp = jax.nn.log_softmax(model.apply(p, b["x"]))
        return -jnp.mean(jnp.take_along_axis(logp, b["y"][..., None], axis=-1))

    return loss, params, batch


@pytest.fixture(scope="module")
def gpt() -> tuple:
    loss, params, batch = linen_setup(GPT())
    return client.trace(loss, params, batch, name="gpt"), loss, params, batch


def test_linen_gpt_is_embedding_blocks_and_head(gpt) -> None:
    spec, *_ = gpt
    assert [layer.name for layer in spec.layers] == ["wte", "h_0", "h_1", "h_2", "ln_f"]
    for i, layer in enumerate(spec.layers[1:-1]):
        assert {p.name.split("/")[1] for p in layer.params} == {f"h_{i}"}
    assert {p.name for p in spec.layers[0].params} == {"params/wpe", "params/wte/embedding"}
    # the head is tied to the embedding: both layers read it
    assert "params/wte/embedding" in {p.name for p in spec.layers[-1].params}
    assert spec.layers[-1].outputs[0].name == spec.loss


def test_linen_blocks_share_a_fingerprint(gpt) -> None:
    spec, *_ = gpt
    prints = [layer.fingerprint for layer in spec.layers]
    assert len(set(prints[1:-1])) == 1
    assert len(set(prints)) == 3


def test_chained_layers_equal_the_flax_loss_and_grads(gpt) -> None:
    spec, loss, params, batch = gpt
    value, grads = composed_loss_and_grads(spec, params, batch, cuts=(2, 4))
    expected, expected_grads = jax.jit(jax.value_and_grad(loss))(params, batch)
    np.testing.assert_allclose(value, float(expected), rtol=1e-5)
    assert value == pytest.approx(float(loss(params, batch)), rel=1e-5)
    want = by_name(expected_grads)
    assert set(grads) == set(want)
    for name, g in grads.items():
        scale = float(np.max(np.abs(want[name])))
        np.testing.assert_allclose(g, want[name], rtol=1e-4, atol=1e-6 + 1e-4 * scale)


class NnxBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.norm = nnx.LayerNorm(D, rngs=rngs)
        self.up = nnx.Linear(D, 2 * D, rngs=rngs)
        self.down = nnx.Linear(2 * D, D, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + self.down(nnx.gelu(self.up(self.norm(x))))


class NnxModel(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(V, D, rngs=rngs)
        self.layers = nnx.List([NnxBlock(rngs) for _ in range(N)])
        self.norm = nnx.LayerNorm(D, rngs=rngs)
        self.head = nnx.Linear(D, V, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def test_nnx_model_is_embedding_blocks_and_head() -> None:
    graphdef, params = nnx.split(NnxModel(nnx.Rngs(0)), nnx.Param)
    batch = {"x": jax.random.randint(jax.random.key(1), (2, T), 0, V)}

    def loss(p: nnx.State, b: dict[str, jax.Array]) -> jax.Array:
        logits = nnx.merge(graphdef, p)(b["x"])
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[..., 0])

    original_call = NnxBlock.__call__
    spec = client.trace(loss, params, batch)
    assert NnxBlock.__call__ is original_call  # the scopes are only there while tracing
    names = ["embed", "layers/0", "layers/1", "layers/2", "norm"]
    assert [layer.name for layer in spec.layers] == names
    assert {p.name for p in spec.layers[1].params} == {
        f"layers/0/{m}/{w}/value" for m, w in [("norm", "scale"), ("norm", "bias")]
    } | {f"layers/0/{m}/{w}/value" for m in ("up", "down") for w in ("kernel", "bias")}
    assert len({layer.fingerprint for layer in spec.layers[1:4]}) == 1
    assert spec.layers[0].fingerprint != spec.layers[1].fingerprint
    assert spec.layers[-1].outputs[0].name == spec.loss
    assert_roundtrip(spec, loss, params, batch, cuts=(2,))
    picked = client.trace(loss, params, batch, scopes="layers/*")
    assert [layer.name for layer in picked.layers] == names


@pytest.mark.parametrize("pattern", ["h_*", "GPT/h_*", "h_?"])
def test_scope_pattern_picks_the_blocks(gpt, pattern: str) -> None:
    spec, loss, params, batch = gpt
    picked = client.trace(loss, params, batch, scopes=pattern)
    assert [layer.name for layer in picked.layers] == [layer.name for layer in spec.layers]


def test_scope_depth_and_other_patterns(gpt) -> None:
    _, loss, params, batch = gpt
    every = client.trace(loss, params, batch, scopes=2)
    names = ["wte", "GPT", "h_0", "h_1", "h_2", "ln_f", "wte.attend"]
    assert [layer.name for layer in every.layers] == names
    assert [layer.name for layer in client.trace(loss, params, batch, scopes=1).layers] == ["GPT"]
    attn = client.trace(loss, params, batch, scopes="attn")
    assert [layer.name for layer in attn.layers][:4] == ["wte", "h_0/attn", "h_0", "h_1/attn"]
    with pytest.raises(ValueError, match=r"matches no scope; scopes seen: \[.*'GPT/h_0'"):
        client.trace(loss, params, batch, scopes="transformer/h_*")
    with pytest.raises(ValueError, match="no scope is that deep"):
        client.trace(loss, params, batch, scopes=9)
    with pytest.raises(ValueError, match=">= 1"):
        client.trace(loss, params, batch, scopes=0)


def test_named_calls_switched_off_by_the_user_still_give_blocks(gpt) -> None:
    spec, loss, params, batch = gpt
    nn.disable_named_call()
    try:
        off = client.trace(loss, params, batch)
        assert nn.module._use_named_call is False  # the user's setting is back
    finally:
        nn.enable_named_call()
    assert [layer.name for layer in off.layers] == [layer.name for layer in spec.layers]


def test_remat_blocks_are_layers() -> None:
    loss, params, batch = linen_setup(GPT(num_blocks=2, remat=True))
    spec = client.trace(loss, params, batch)
    assert [layer.name for layer in spec.layers] == ["wte", "h_0", "h_1", "ln_f"]
    assert "remat" in spec.layers[1].jaxpr or "checkpoint" in spec.layers[1].jaxpr
    assert spec.layers[1].fingerprint == spec.layers[2].fingerprint


def test_clustering_cuts_only_between_modules(gpt) -> None:
    _, loss, params, batch = gpt
    spec = client.trace(loss, params, batch, layers=3)
    assert spec.num_layers == 3
    owner: dict[str, int] = {}
    for k, layer in enumerate(spec.layers):
        for p in layer.params:
            module = p.name.split("/")[1]
            if module != "wte":  # tied: the embedding and the head both read it
                assert owner.setdefault(module, k) == k, f"{module} is cut across layers"
    assert sorted(owner) == ["h_0", "h_1", "h_2", "ln_f", "wpe"]
    with pytest.raises(ValueError, match=r"layers=40: .* pass layers between 1 and 5"):
        client.trace(loss, params, batch, layers=40)


def test_auto_level_prefers_the_blocks_that_hold_the_flops() -> None:
    """Synthetic scope paths: repeated `Dense_0, Dense_1` in a small head one level above
    the big transformer blocks; the blocks win. On a tie the shallower level wins."""
    paths = [
        ("M", "embed"),
        ("M", "tr", "h_0", "mlp"),
        ("M", "tr", "h_0"),
        ("M", "tr", "h_1", "mlp"),
        ("M", "Dense_0"),
        ("M", "Dense_1"),
        (),
    ]
    flops = [1.0, 100.0, 5.0, 100.0, 2.0, 2.0, 1.0]
    level = choose_level(paths, flops, None)
    assert level == Level(3, frozenset({("M", "tr", "h_0"), ("M", "tr", "h_1")}))
    assert level_segments(paths, level) == [
        ("embed", 0, 1),
        ("tr/h_0", 1, 3),
        ("tr/h_1", 3, 4),
        ("Dense_0", 4, 7),
    ]
    tie = [("a", "b0", "c0"), ("a", "b0", "c1"), ("a", "b1", "c0"), ("a", "b1", "c1")]
    assert choose_level(tie, [1.0] * 4, None).depth == 2
    two = [("enc", "layers_0"), ("enc", "layers_1"), ("dec", "layers_0"), ("dec", "layers_1")]
    names = [s[0] for s in level_segments(two, choose_level(two, [1.0] * 4, None))]
    assert names == ["enc/layers_0", "enc/layers_1", "dec/layers_0", "dec/layers_1"]
    markers = [("embed",), ("block0",), ("block1",), ("head",), ()]
    assert choose_level(markers, [1.0] * 5, None).depth == 1
    assert [s[0] for s in level_segments(markers, Level(1))] == [
        "embed",
        "block0",
        "block1",
        "head",
    ]


def test_tracing_plain_jax_does_not_import_flax() -> None:
    code = (
        "import sys, jax.numpy as jnp, client\n"
        "w, x = jnp.ones((4, 2)), jnp.ones((3, 4))\n"
        "client.trace(lambda p, b: jnp.mean(b['x'] @ p), w, {'x': x})\n"
        "assert 'flax' not in sys.modules; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_flax_gpt_example_plans_end_to_end() -> None:
    """examples/flax_gpt.py: trace, start a local server and worker, plan, print the stages."""
    example = Path(__file__).resolve().parents[2] / "examples" / "flax_gpt.py"
    out = subprocess.run(
        [sys.executable, str(example), "--blocks", "2", "--hidden", "32"],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[1] for line in lines[:4]] == ["wte", "h_0", "h_1", "ln_f"]
    assert lines[1].split()[-1] == lines[2].split()[-1]  # the blocks' fingerprint
    stages = [line.split()[1] for line in lines if line.startswith("stage ")]
    outside = {line.split()[1] for line in lines if line.startswith("outside ")}
    assert stages and outside <= {"wte..wte", "ln_f..ln_f"}, out.stdout
    # the embedding and the head are in the first and last stage, or outside the pipeline
    assert stages[0].startswith("wte..") or "wte..wte" in outside, out.stdout
    assert stages[-1].endswith("..ln_f") or "ln_f..ln_f" in outside, out.stdout
    assert "stages measured" in out.stdout and "predicted iteration" in out.stdout
