"""Sharding by rule tables: today's strategies as before, MaxText's rules, activations, mesh."""

import re

import jax
import pytest
from jax.sharding import PartitionSpec as P

from client.zoo import make as make_zoo
from schemas import ParamSpec, ShardingConfig, VarSpec
from schemas.sharding import MAXTEXT_RULES, ShardingStrategy, fill_mesh_axes
from tests.workers import legacy_sharding as legacy
from tests.workers.specs import dense_spec
from workers.measure.compose import compose_stage
from workers.measure.hlo_stats import collective_bytes
from workers.measure.sharding import (
    activation_spec,
    config_param_specs,
    make_mesh,
    param_specs,
    stage_shardings,
)
from workers.measure.stage_modules import StageModules

STRATEGIES = ("data", "megatron", "fsdp")


def param(name: str, *shape: int, axes: tuple[str | None, ...] | None = None) -> ParamSpec:
    return ParamSpec(name=name, shape=shape, dtype="float32", logical_axes=axes)


MLP = [param("w1", 16, 64), param("b1", 64), param("w2", 64, 16), param("b2", 16)]


def legacy_config(strategy: str, dp: int, tp: int) -> ShardingConfig:
    return ShardingConfig(logical_mesh=(dp, tp), strategy=strategy)


def maxtext(**sizes: int) -> ShardingConfig:
    strategy = ShardingStrategy(name="maxtext", mesh_axes=sizes, rules=MAXTEXT_RULES)
    return ShardingConfig.from_strategy(strategy, fill_mesh_axes(sizes, _product(sizes)))


def _product(sizes: dict[str, int]) -> int:
    n = 1
    for s in sizes.values():
        n *= s
    return n


def _zoo_params(name: str, **overrides: int) -> list[ParamSpec]:
    built = make_zoo(name, **overrides)
    flat, _ = jax.tree_util.tree_flatten_with_path(built.params)
    out = []
    for path, leaf in flat:
        key = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        out.append(
            ParamSpec(
                name=key.replace("/", "_"),
                shape=tuple(leaf.shape),
                dtype="float32",
                logical_axes=built.logical_axes.get(key),
            )
        )
    return out


def _as_legacy(spec: P, strategy: str) -> P:
    """A new PartitionSpec in the legacy mesh's axis names (tensor -> model, the dp axis ->
    data)."""
    names = {"tensor": "model", "data": "data", "fsdp": "data"}
    return P(*[None if d is None else names[d] for d in spec])


def test_data_replicates_everything() -> None:
    assert config_param_specs(legacy_config("data", 4, 2), MLP) == [P(), P(), P(), P()]


def test_megatron_alternates_column_and_row_splits_without_axis_names() -> None:
    specs = config_param_specs(legacy_config("megatron", 1, 4), MLP)
    # w1 column split, its bias follows, w2 row split, b2 (after a row split) replicated
    assert specs == [P(None, "tensor"), P("tensor"), P("tensor"), P()]


def test_megatron_uses_logical_axis_names() -> None:
    params = [
        param("emb", 32, 16, axes=("vocab", "embed")),
        param("wq", 16, 16, axes=("embed", "heads")),
        param("scale", 16, axes=("embed",)),
        param("w2", 64, 16, axes=("mlp", "embed")),
    ]
    assert config_param_specs(legacy_config("megatron", 2, 2), params) == [
        P("tensor"),
        P(None, "tensor"),
        P(),
        P("tensor"),
    ]


def test_fsdp_splits_the_largest_divisible_dim_plus_megatron() -> None:
    assert config_param_specs(legacy_config("fsdp", 4, 1), MLP) == [
        P(None, "fsdp"),
        P("fsdp"),
        P("fsdp"),
        P("fsdp"),
    ]
    assert config_param_specs(legacy_config("fsdp", 2, 2), MLP) == [
        P("fsdp", "tensor"),
        P("tensor"),
        P("tensor", "fsdp"),
        P("fsdp"),
    ]
    assert config_param_specs(legacy_config("fsdp", 2, 1), [param("odd", 3, 5)]) == [P()]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("dp", "tp"), [(8, 1), (4, 2), (2, 4), (1, 8), (2, 2)])
@pytest.mark.parametrize("model", ["gpt", "moe", "mlp", "unnamed"])
def test_todays_strategies_lay_out_parameters_as_before(
    strategy: str, dp: int, tp: int, model: str
) -> None:
    """Each of today's strategies, as a rule table, gives every parameter of the zoo models
    (named and unnamed) the PartitionSpec the code before mesh axes gave it."""
    if model == "unnamed":
        params = [p.model_copy(update={"logical_axes": None}) for p in _zoo_params("gpt")]
    else:
        params = _zoo_params(model)
        assert all(p.logical_axes is not None for p in params)
    want = legacy.PARAM_RULES[strategy](params, dp, tp)
    got = config_param_specs(legacy_config(strategy, dp, tp), params)
    assert [_as_legacy(s, strategy) for s in got] == want


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_todays_batch_rule_is_as_before(strategy: str) -> None:
    config = legacy_config(strategy, 4, 2)
    for shape in [(8, 4), (3, 4), (), (8, 16, 32)]:
        v = VarSpec(name="x", shape=shape, dtype="float32")
        got = activation_spec(v, config.axis_sizes, config.layout_rules, seq_len=16)
        assert _as_legacy(got, strategy) == legacy.batch_spec(v, 4)


def _sharding_text(hlo: str) -> list[str]:
    return sorted(re.findall(r"sharding=\{[^}]*\}", hlo))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("dp", "tp"), [(2, 2), (4, 1)])
def test_todays_strategies_compile_to_the_same_hlo_shardings_and_collectives(
    strategy: str, dp: int, tp: int
) -> None:
    """A stage compiled under the rule table on the five-axis mesh has the same sharding
    annotations and collectives (bytes per kind) as under the code before mesh axes."""
    spec = dense_spec(batch=8, hidden=16, ffn=32, blocks=2)
    program = compose_stage(spec, 0, 1)
    config = legacy_config(strategy, dp, tp)
    devices = jax.devices()[: dp * tp]
    old_mesh = legacy.make_mesh(devices, config)
    old = legacy.stage_shardings(old_mesh, config, program.params, program.inputs)
    new = stage_shardings(make_mesh(devices, config), config, program.params, program.inputs)
    texts = []
    for shardings in (old, new):
        modules = StageModules(program, shardings, "adam")  # type: ignore[arg-type]
        fwd = modules.compile_forward().compiled.as_text()
        bwd = modules.compile_backward().compiled.as_text()
        texts.append((fwd, bwd))
    for old_text, new_text in zip(texts[0], texts[1], strict=True):
        assert _sharding_text(old_text)
        assert collective_bytes(new_text) == collective_bytes(old_text)
        assert _sharding_text(new_text) == _sharding_text(old_text)


def test_maxtext_rules_split_embed_on_fsdp_and_mlp_on_tensor() -> None:
    config = maxtext(fsdp=2, tensor=2)
    params = [
        param("w1", 16, 64, axes=("embed", "mlp")),
        param("wte", 32, 16, axes=("vocab", "embed")),
        param("b1", 64, axes=("mlp",)),
        param("plain", 16, 64),  # no names: structural fallback (column split, fsdp on rows)
    ]
    assert config_param_specs(config, params) == [
        P("fsdp", "tensor"),
        P("tensor", "fsdp"),
        P("tensor"),
        P("fsdp", "tensor"),
    ]


def test_maxtext_rules_put_experts_on_the_expert_axis() -> None:
    config = maxtext(expert=4, fsdp=2)
    wi = param("moe_wi", 8, 16, 64, axes=("experts", "embed", None))
    # embed -> (fsdp, context, expert): expert is taken by dim 0, context has size 1
    assert config_param_specs(config, [wi]) == [P("expert", "fsdp")]
    # the batch goes over data, fsdp and expert
    x = VarSpec(name="x", shape=(16, 32, 8), dtype="float32")
    assert activation_spec(x, config.axis_sizes, config.layout_rules) == P(("fsdp", "expert"))


def test_context_rule_splits_the_sequence_dim_of_activations() -> None:
    config = maxtext(data=2, context=4)
    sizes, rules = config.axis_sizes, config.layout_rules
    hidden = VarSpec(name="h", shape=(8, 1024, 64), dtype="float32")
    tokens = VarSpec(name="tokens", shape=(8, 1024), dtype="int32")
    assert activation_spec(hidden, sizes, rules, seq_len=1024) == P("data", "context")
    assert activation_spec(tokens, sizes, rules, seq_len=1024) == P("data", "context")
    # no sequence (an MLP's activations): only the batch rule
    assert activation_spec(hidden, sizes, rules, seq_len=None) == P("data")
    # an axis that would not divide the dim is left out
    odd = VarSpec(name="odd", shape=(3, 1024, 64), dtype="float32")
    assert activation_spec(odd, sizes, rules, seq_len=1024) == P(None, "context")


def test_a_rule_axis_is_used_once_per_array() -> None:
    sizes = fill_mesh_axes({"tensor": 2, "fsdp": 2}, 4)
    rules = {"a": ("tensor",), "b": ("tensor", "fsdp")}
    assert param_specs([param("w", 8, 8, axes=("a", "b"))], sizes, rules) == [P("tensor", "fsdp")]


def test_mesh_has_the_five_axes_in_order() -> None:
    mesh = make_mesh(jax.devices()[:8], maxtext(data=2, tensor=4))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 1, "context": 1, "expert": 1, "tensor": 4}
    # tensor innermost: a tensor group is 4 consecutive devices
    assert [d.id for d in mesh.devices[0, 0, 0, 0]] == [0, 1, 2, 3]
    legacy_mesh = make_mesh(jax.devices()[:4], legacy_config("fsdp", 2, 2))
    assert dict(legacy_mesh.shape)["fsdp"] == 2


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_stage_shardings_describe_names_every_param_and_input(strategy: str) -> None:
    config = ShardingConfig(logical_mesh=(2, 2), strategy=strategy)
    mesh = make_mesh(jax.devices()[:4], config)
    x = VarSpec(name="x", shape=(8, 16), dtype="float32")
    sh = stage_shardings(mesh, config, MLP, [x])
    described = sh.describe(MLP, [x])
    assert list(described) == ["w1", "b1", "w2", "b2", "x"]
    assert described["x"] == ("P('fsdp',)" if strategy == "fsdp" else "P('data',)")
    assert all(s.mesh is mesh for s in sh.params + sh.inputs)


def test_make_mesh_rejects_a_wrong_device_count() -> None:
    with pytest.raises(ValueError, match="needs 4 devices"):
        make_mesh(jax.devices()[:2], ShardingConfig(logical_mesh=(2, 2), strategy="data"))
