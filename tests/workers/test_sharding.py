"""Sharding strategies: parameter rules, batch rule, mesh."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from schemas import ParamSpec, ShardingConfig, VarSpec
from schemas.cluster import StrategyName
from workers.measure.sharding import PARAM_RULES, batch_spec, make_mesh, stage_shardings


def param(name: str, *shape: int, axes: tuple[str | None, ...] | None = None) -> ParamSpec:
    return ParamSpec(name=name, shape=shape, dtype="float32", logical_axes=axes)


MLP = [param("w1", 16, 64), param("b1", 64), param("w2", 64, 16), param("b2", 16)]


def test_every_strategy_has_a_rule() -> None:
    assert set(PARAM_RULES) == set(StrategyName.__args__)


def test_data_replicates_everything() -> None:
    assert PARAM_RULES["data"](MLP, 4, 2) == [P(), P(), P(), P()]


def test_megatron_alternates_column_and_row_splits_without_axis_names() -> None:
    specs = PARAM_RULES["megatron"](MLP, 1, 4)
    # w1 column split, its bias follows, w2 row split, b2 (after a row split) replicated
    assert specs == [P(None, "model"), P("model"), P("model"), P()]


def test_megatron_uses_logical_axis_names() -> None:
    params = [
        param("emb", 32, 16, axes=("vocab", "embed")),
        param("wq", 16, 16, axes=("embed", "heads")),
        param("scale", 16, axes=("embed",)),
        param("w2", 64, 16, axes=("mlp", "embed")),
    ]
    assert PARAM_RULES["megatron"](params, 2, 2) == [P("model"), P(None, "model"), P(), P("model")]


def test_megatron_only_splits_divisible_dims() -> None:
    params = [param("w", 6, 10), param("v", 6, 10, axes=("embed", "mlp"))]
    assert PARAM_RULES["megatron"](params, 1, 4) == [P(), P()]
    assert PARAM_RULES["megatron"](MLP, 2, 1) == [P(), P(), P(), P()]


def test_fsdp_splits_the_largest_divisible_dim_on_data_plus_megatron() -> None:
    assert PARAM_RULES["fsdp"](MLP, 4, 1) == [P(None, "data"), P("data"), P("data"), P("data")]
    assert PARAM_RULES["fsdp"](MLP, 2, 2) == [
        P("data", "model"),
        P("model"),
        P("model", "data"),
        P("data"),
    ]
    # nothing divisible by dp: replicated
    assert PARAM_RULES["fsdp"]([param("odd", 3, 5)], 2, 1) == [P()]


def test_batch_spec_puts_dim0_on_data_when_divisible() -> None:
    x = VarSpec(name="x", shape=(8, 4), dtype="float32")
    odd = VarSpec(name="odd", shape=(3, 4), dtype="float32")
    scalar = VarSpec(name="s", shape=(), dtype="float32")
    assert batch_spec(x, 4) == P("data")
    assert batch_spec(x, 1) == P()
    assert batch_spec(odd, 2) == P()
    assert batch_spec(scalar, 2) == P()


@pytest.mark.parametrize("strategy", ["data", "megatron", "fsdp"])
def test_stage_shardings_describe_names_every_param_and_input(strategy: str) -> None:
    config = ShardingConfig(logical_mesh=(2, 2), strategy=strategy)
    mesh = make_mesh(jax.devices()[:4], config)
    assert dict(mesh.shape) == {"data": 2, "model": 2}
    x = VarSpec(name="x", shape=(8, 16), dtype="float32")
    sh = stage_shardings(mesh, config, MLP, [x])
    described = sh.describe(MLP, [x])
    assert list(described) == ["w1", "b1", "w2", "b2", "x"]
    assert described["x"] == "P('data',)"
    assert all(s.mesh is mesh for s in sh.params + sh.inputs)


def test_make_mesh_rejects_a_wrong_device_count() -> None:
    with pytest.raises(ValueError, match="needs 4 devices"):
        make_mesh(jax.devices()[:2], ShardingConfig(logical_mesh=(2, 2), strategy="data"))
