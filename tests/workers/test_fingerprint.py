"""Stage fingerprints: equal for identical stages, different when the measurement differs."""

import pytest

from schemas import ModelSpec, PlanOptions, ShardingConfig, SubmeshShape
from tests.workers.specs import dense_spec
from workers.measure.fingerprint import stage_fingerprint, stage_io

SUBMESH = SubmeshShape(hosts=1, devices_per_host=2)
DATA = ShardingConfig(logical_mesh=(2, 1), strategy="data")
OPTIONS = PlanOptions()


@pytest.fixture(scope="module")
def gpt() -> ModelSpec:
    from client import zoo

    return zoo.build("gpt", num_layers=4)


def fp(spec: ModelSpec, start: int, end: int, **changes: object) -> str:
    args: dict[str, object] = dict(
        submesh=SUBMESH, config=DATA, device_kind="cpu", jax_version="0.10.2", options=OPTIONS
    )
    args.update(changes)
    return stage_fingerprint(spec, start, end, **args)  # type: ignore[arg-type]


def test_equal_ranges_of_identical_gpt_blocks_have_equal_fingerprints(gpt: ModelSpec) -> None:
    assert [layer.name for layer in gpt.layers[1:5]] == ["block0", "block1", "block2", "block3"]
    assert fp(gpt, 1, 2) == fp(gpt, 2, 3) == fp(gpt, 3, 4)
    assert fp(gpt, 1, 1) == fp(gpt, 4, 4)
    assert fp(gpt, 0, 1) != fp(gpt, 1, 2)  # embedding + block is another stage
    assert fp(gpt, 3, 4) != fp(gpt, 4, 5)  # the head reads labels and outputs the loss
    assert fp(gpt, 1, 2) != fp(gpt, 1, 3)


def test_fingerprint_covers_what_changes_a_measurement(gpt: ModelSpec) -> None:
    base = fp(gpt, 1, 2)
    assert fp(gpt, 1, 2, submesh=SubmeshShape(hosts=1, devices_per_host=4)) != base
    assert fp(gpt, 1, 2, config=ShardingConfig(logical_mesh=(2, 1), strategy="fsdp")) != base
    assert fp(gpt, 1, 2, config=ShardingConfig(logical_mesh=(1, 2), strategy="data")) != base
    assert fp(gpt, 1, 2, device_kind="NVIDIA H100") != base
    assert fp(gpt, 1, 2, jax_version="0.10.3") != base
    assert fp(gpt, 1, 2, options=PlanOptions(optimizer="sgd")) != base
    assert fp(gpt, 1, 2, options=PlanOptions(repeats=3)) != base
    assert fp(gpt, 1, 2, options=PlanOptions(warmup=0)) != base


def test_fingerprint_ignores_limits_and_planning_options(gpt: ModelSpec) -> None:
    base = fp(gpt, 1, 2)
    same = PlanOptions(
        candidate_timeout_s=1.0,
        num_microbatches=16,
        strategies=["data"],
        include_communication=True,
    )
    assert fp(gpt, 1, 2, options=same) == base


def test_fingerprint_depends_on_shapes() -> None:
    assert fp(dense_spec(batch=8), 0, 0) != fp(dense_spec(batch=16), 0, 0)
    spec = dense_spec(blocks=3)
    assert fp(spec, 1, 1) == fp(spec, 2, 2)
    # block0 reads the batch input x, whose cotangent nobody needs: another backward
    assert fp(spec, 0, 0) != fp(spec, 1, 1)


def test_stage_keys_come_from_the_programs_not_the_claimed_fingerprint() -> None:
    spec = dense_spec(blocks=3)
    # every block claims the fingerprint "block"; the programs say block0 differs
    assert {layer.fingerprint for layer in spec.layers[:3]} == {"block"}
    liar = spec.model_copy(
        update={
            "layers": [
                layer.model_copy(update={"fingerprint": "someone-elses"}) for layer in spec.layers
            ]
        }
    )
    assert fp(liar, 1, 2) == fp(spec, 1, 2)


def test_stage_io_inputs_and_outputs(gpt: ModelSpec) -> None:
    inputs, outputs = stage_io(gpt, 1, 2)
    assert [v.name for v in inputs] == ["embed:0"]
    assert [v.name for v in outputs] == ["block1:0"]
    inputs, outputs = stage_io(gpt, 4, 5)
    assert [v.name for v in inputs] == ["block2:0", "labels"]
    assert [v.name for v in outputs] == [gpt.loss]


# Stage fingerprints of today's strategies as the code before mesh axes computed them (commit
# a7ad1d8, same spec, submesh, device kind, jax version and options): a stored measurement of
# a `data` / `megatron` / `fsdp` stage is found and reused. A change that means to re-key
# stored measurements updates these on purpose.
LEGACY_FINGERPRINTS = {
    ("data", (2, 1)): "8344653a5687e68e4e74bcb4b6d71c6ac49adbb9ff1cc49bca69586a185282af",
    ("megatron", (1, 2)): "de27aa04b815552d9a59c2eb96fa73208c669c424dda64d90822c4835b824b6e",
    ("fsdp", (2, 1)): "6d09ab1dabbe2b8fb7dca2a920c6449c8b217153ba7a4bdcd2dbde4a38f54c2f",
}


def test_todays_strategies_keep_their_stage_fingerprints() -> None:
    from schemas.sharding import LEGACY_RULES, ShardingStrategy, fill_mesh_axes

    spec = dense_spec()
    submesh = SubmeshShape(hosts=1, devices_per_host=2)
    seen = set()
    for (strategy, mesh), want in LEGACY_FINGERPRINTS.items():
        options = {"force_batch_dim_to_mesh_dim": 0} if strategy == "data" else {}
        config = ShardingConfig(logical_mesh=mesh, strategy=strategy, options=options)
        fp = stage_fingerprint(spec, 0, 1, submesh, config, "cpu", "0.10.2", PlanOptions())
        assert fp == want
        # the same point written out as mesh axes and rules is another config: a new key
        sizes = fill_mesh_axes(config.axis_sizes, 2)
        point = ShardingConfig.from_strategy(
            ShardingStrategy(name=strategy, mesh_axes=sizes, rules=LEGACY_RULES[strategy]),
            sizes,
            options=options,
        )
        seen.add(stage_fingerprint(spec, 0, 1, submesh, point, "cpu", "0.10.2", PlanOptions()))
    assert len(seen) == 3 and not seen & set(LEGACY_FINGERPRINTS.values())
