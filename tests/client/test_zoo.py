"""The model zoo: defaults, overrides, published presets, round-trip numerics."""

import math

import jax
import numpy as np
import pytest

from client import zoo
from client.zoo.base import init_params
from tests.client.helpers import assert_roundtrip, by_name
from workers.measure.compose import compose_stage

TINY = {
    "mlp": {"hidden_size": 16, "ffn_size": 32, "batch_size": 4},
    "gpt": {
        "num_layers": 2,
        "hidden_size": 16,
        "num_heads": 2,
        "seq_len": 8,
        "vocab_size": 32,
        "batch_size": 2,
    },
    "moe": {
        "num_layers": 2,
        "hidden_size": 16,
        "num_heads": 2,
        "seq_len": 8,
        "vocab_size": 32,
        "batch_size": 2,
        "num_experts": 4,
        "expert_group_size": 8,
    },
    "wresnet": {
        "num_layers": 10,
        "width_factor": 1,
        "num_channels": 4,
        "image_size": 16,
        "num_classes": 5,
        "batch_size": 2,
    },
}


def test_names() -> None:
    assert zoo.names() == ["gpt", "mlp", "moe", "wresnet"]


def test_mlp_seed_preset_is_the_seed() -> None:
    spec = zoo.build("mlp", preset="seed")
    assert [layer.name for layer in spec.layers] == ["layer0", "layer1"]
    assert [(v.name, v.shape) for v in spec.inputs] == [("x", (128, 2048)), ("y", (128, 2048))]
    for layer in spec.layers:
        assert [p.shape for p in layer.params] == [(8192,), (2048,), (2048, 8192), (8192, 2048)]
        assert layer.flops >= 2 * 2 * 128 * 2048 * 8192
    assert sum(layer.param_bytes for layer in spec.layers) == 2 * 4 * (
        2 * 2048 * 8192 + 8192 + 2048
    )
    assert spec.layers[0].outputs[0].shape == (128, 2048)
    assert spec.layers[1].outputs[0].shape == ()
    assert spec.layers[0].params[2].logical_axes == ("embed", "mlp")
    small = zoo.build("mlp")
    assert small.inputs[0].shape == (32, 256)


def test_gpt_layers_and_axes() -> None:
    spec = zoo.build("gpt", **TINY["gpt"] | {"num_layers": 4})
    assert [layer.name for layer in spec.layers] == [
        "embed",
        "block0",
        "block1",
        "block2",
        "block3",
        "head",
    ]
    assert [v.name for v in spec.inputs] == ["labels", "tokens"]
    axes = {p.name: p.logical_axes for layer in spec.layers for p in layer.params}
    assert axes["embed/wte"] == ("vocab", "embed")
    assert axes["blocks/2/wq"] == ("embed", "heads")
    assert axes["blocks/2/w2"] == ("mlp", "embed")
    assert axes["head/w_out"] == ("embed", "vocab")


def test_moe_alternates_expert_and_dense_blocks() -> None:
    spec = zoo.build("moe", **TINY["moe"] | {"num_layers": 4})
    fp = {layer.name: layer.fingerprint for layer in spec.layers}
    assert fp["block0"] == fp["block2"] != fp["block1"] == fp["block3"]
    params = {p.name: p for p in spec.layers[1].params}
    assert params["blocks/0/moe_wi"].shape == (4, 16, 64)
    assert params["blocks/0/moe_wi"].logical_axes[0] == "experts"


def test_wresnet_has_a_layer_per_block() -> None:
    spec = zoo.build("wresnet", **TINY["wresnet"])
    assert spec.num_layers == 1 + 4 + 1
    assert spec.layers[0].name == "stem" and spec.layers[-1].name == "head"
    bottleneck = zoo.build("wresnet", **TINY["wresnet"] | {"num_layers": 50, "width_factor": 2})
    assert bottleneck.num_layers == 1 + 16 + 1
    fp = [layer.fingerprint for layer in bottleneck.layers]
    assert fp[2] == fp[3] and fp[1] != fp[2]  # blocks after a stage's first are identical


def test_wresnet_forward_roundtrip() -> None:
    # The gradient round trip (compiling conv backprop on CPU takes long) is marked slow.
    spec = zoo.build("wresnet", **TINY["wresnet"])
    built = zoo.make("wresnet", **TINY["wresnet"])
    params = init_params(built.params, jax.random.key(0))
    batch = built.sample_batch(jax.random.key(1))
    stage = compose_stage(spec, 0, spec.num_layers - 1)
    named = by_name(params)
    (loss,) = jax.jit(stage.fn)(
        [named[p.name] for p in stage.params], [batch[v.name] for v in stage.inputs]
    )
    np.testing.assert_allclose(loss, jax.jit(built.loss_fn)(params, batch), rtol=1e-5)


@pytest.mark.parametrize(
    "name", ["gpt", "mlp", "moe", pytest.param("wresnet", marks=pytest.mark.slow)]
)
def test_roundtrip(name: str) -> None:
    spec = zoo.build(name, **TINY[name])
    built = zoo.make(name, **TINY[name])
    params = init_params(built.params, jax.random.key(0))
    batch = built.sample_batch(jax.random.key(1))
    assert_roundtrip(spec, built.loss_fn, params, batch, cuts=(1,), rtol=1e-4)


def test_overrides_are_validated() -> None:
    with pytest.raises(
        ValueError, match=r"unknown override\(s\) \['hidden'\]; allowed: .*hidden_size"
    ):
        zoo.build("gpt", hidden=3)
    with pytest.raises(ValueError, match="unknown preset '1T'; one of .*39B"):
        zoo.build("gpt", preset="1T")
    with pytest.raises(ValueError, match="num_layers must be an int"):
        zoo.build("gpt", num_layers="4")
    with pytest.raises(ValueError, match="must be >= 1"):
        zoo.build("gpt", num_layers=0)
    with pytest.raises(ValueError, match="num_layers must be at most 1022"):
        zoo.build("gpt", num_layers=2**24)
    with pytest.raises(ValueError, match="divisible by num_heads"):
        zoo.build("gpt", hidden_size=30, num_heads=4)
    with pytest.raises(ValueError, match="unknown zoo model 'bert'"):
        zoo.build("bert")
    with pytest.raises(ValueError, match="multiple of expert_group_size"):
        zoo.build("moe", expert_group_size=100)
    with pytest.raises(ValueError, match="num_layers must be one of"):
        zoo.build("wresnet", num_layers=7)


def _param_count(name: str, **overrides: object) -> int:
    built = zoo.make(name, **overrides)
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(built.params))


@pytest.mark.parametrize("preset", ["125M", "1.3B", "39B"])
def test_gpt_presets_have_their_published_sizes(preset: str) -> None:
    c = zoo.get("gpt").config({"preset": preset})
    h, n, v, s = c["hidden_size"], c["num_layers"], c["vocab_size"], c["seq_len"]
    blocks = n * (12 * h * h + 13 * h)
    # Untied input and output embeddings (Alpa ties them): one extra vocab x hidden matrix.
    assert _param_count("gpt", preset=preset) == blocks + 2 * v * h + s * h + 2 * h
    published = {"125M": 0.125e9, "1.3B": 1.3e9, "39B": 39e9}[preset]
    assert abs(blocks + v * h - published) / published < 0.1


@pytest.mark.parametrize(("preset", "billions"), [("250M", 0.25), ("1B", 1.0), ("6.8B", 6.8)])
def test_wresnet_presets_have_their_published_sizes(preset: str, billions: float) -> None:
    assert abs(_param_count("wresnet", preset=preset) / 1e9 - billions) / billions < 0.05


def test_moe_preset_sets_alpas_config() -> None:
    c = zoo.get("moe").config({"preset": "2.4B", "batch_size": 2})
    assert (c["hidden_size"], c["num_layers"], c["num_experts"]) == (1024, 16, 16)
    assert (c["expert_group_size"], c["vocab_size"], c["batch_size"]) == (2048, 32000, 2)


def test_published_gpt_builds_without_allocating() -> None:
    spec = zoo.build("gpt", preset="1.3B", batch_size=1)
    assert spec.num_layers == 24 + 2
    assert len({layer.fingerprint for layer in spec.layers}) == 3
    # one export per fingerprint
    assert spec.layers[1].forward == spec.layers[2].forward
    assert spec.layers[1].backward == spec.layers[2].backward
    assert spec.inputs[0].shape == (1, 1024)


def test_spec_from_request_is_build() -> None:
    a = zoo.spec_from_request("gpt", TINY["gpt"])
    b = zoo.build("gpt", **TINY["gpt"])
    assert [layer.fingerprint for layer in a.layers] == [layer.fingerprint for layer in b.layers]
    assert a.model_dump(exclude={"layers"}) == b.model_dump(exclude={"layers"})
