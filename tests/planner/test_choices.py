"""Submesh and config choices, and the candidate space."""

import math

import pytest

from planner import config_choices, enumerate_candidates, submesh_choices
from schemas import PlanOptions, StageKey, SubmeshShape
from tests.planner.helpers import cluster, programless_chain_spec


def test_submesh_choices_match_alpa() -> None:
    assert submesh_choices(1, 8) == [(1, 1), (1, 2), (1, 4), (1, 8)]
    assert submesh_choices(8, 4) == [(1, 1), (1, 2), (1, 4), (2, 4), (4, 4), (8, 4)]
    assert submesh_choices(6, 2, "power_of_two") == [(1, 1), (1, 2), (2, 2), (4, 2)]
    assert submesh_choices(3, 2, "all") == [(1, 1), (1, 2), (2, 2), (3, 2)]
    assert submesh_choices(16, 2, "small_power_of_two") == [(1, 1), (1, 2), (2, 2), (4, 2)]
    assert submesh_choices(2, 4, "manual", [(1, 2), (2, 4)]) == [(1, 2), (2, 4)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((1, 3, "power_of_two"), "power of two"),
        ((1, 4, "nope"), "unknown submesh space"),
        ((1, 4, "manual"), "non-empty"),
        ((1, 4, "manual", [(2, 4)]), "does not fit"),
        ((2, 4, "manual", [(2, 2)]), "whole hosts"),
        ((2, 4, "manual", [(1, 2), (1, 2)]), "twice"),
    ],
)
def test_submesh_choices_refuse_bad_input(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        submesh_choices(*args)


def labels(configs: list) -> list[str]:
    return [c.label() for c in configs]


def test_config_choices_order_and_redundancy() -> None:
    assert labels(config_choices((1, 4), 8)) == [
        "4x1/data",
        "4x1/fsdp",
        "2x2/megatron",
        "2x2/fsdp",
        "1x4/megatron",
    ]
    assert labels(config_choices(SubmeshShape(hosts=1, devices_per_host=1), 8)) == ["1x1/data"]
    data = config_choices((1, 2), 8)[0]
    assert data.options == {"force_batch_dim_to_mesh_dim": 0}
    assert config_choices((1, 2), 8)[1].options == {}


def test_config_choices_respect_batch_space_and_strategies() -> None:
    # dp must divide the micro-batch: 3 does not split over 2 or 4
    assert labels(config_choices((1, 4), 3, strategies=("data",))) == ["1x4/data"]
    assert labels(config_choices((2, 2), 8, "single_node_model_parallel", ("data",))) == [
        "4x1/data"
    ]
    # "data" on a tensor axis only where the submesh has nothing else: its largest-dp mesh
    assert labels(config_choices((1, 4), 2, strategies=("data",))) == ["2x2/data"]
    assert labels(config_choices((1, 4), 2, strategies=("data", "fsdp"))) == ["2x2/fsdp"]
    assert labels(config_choices((1, 4), 8, "data_parallel_only")) == ["4x1/data", "4x1/fsdp"]
    assert config_choices((1, 4), 2, "data_parallel_only") == []
    assert labels(config_choices((1, 2), 8, strategies=("megatron", "data"))) == [
        "2x1/data",
        "1x2/megatron",
    ]
    with pytest.raises(ValueError, match="unknown config space"):
        config_choices((1, 2), 8, "nope")


def test_candidates_whole_cluster_gets_only_the_full_range() -> None:
    spec = programless_chain_spec(3)
    space = enumerate_candidates(spec, cluster(1, 4), PlanOptions(strategies=["data"]))
    assert [s.as_tuple() for s in space.submeshes] == [(1, 1), (1, 2), (1, 4)]
    whole = [k for k in space.keys if k.submesh_id == 2]
    assert {(k.start, k.end) for k in whole} == {(0, 2)}
    # largest submesh first, then start, end, config
    assert [k.submesh_id for k in space.keys][: len(whole)] == [2] * len(whole)
    small = [k.as_tuple() for k in space.keys if k.submesh_id == 0]
    assert small == sorted(small) and len(small) == 6  # 6 ranges x 1 config
    assert len({k.as_tuple() for k in space.keys}) == len(space.keys)


def test_candidate_space_resolve() -> None:
    space = enumerate_candidates(programless_chain_spec(2), cluster(1, 2), PlanOptions())
    submesh, config = space.resolve(StageKey(start=0, end=1, submesh_id=1, config_id=1))
    assert submesh.as_tuple() == (1, 2) and config.label() == "2x1/fsdp"
    assert space.resolve((0, 0, 0, 0))[1].label() == "1x1/data"
    with pytest.raises(IndexError):
        space.resolve((0, 0, 0, 5))
    assert space.max_configs == 3


def test_layer_imbalance_tolerance_like_alpa() -> None:
    # Alpa keeps a range when flops_share / (1 + tol) <= device_share <= flops_share * (1 + tol).
    # 4 equal layers on 4 devices, tol = 0.4: on (1,1) (share 1/4) only single layers
    # (2 layers: 0.5 / 1.4 = 0.36 > 0.25); on (1,2) (share 1/2) only pairs
    # (1 layer: 0.25 * 1.4 = 0.35 < 0.5; 3 layers: 0.75 / 1.4 = 0.54 > 0.5).
    spec = programless_chain_spec(4, flops=[1.0] * 4)
    options = PlanOptions(strategies=["data"], layer_imbalance_tolerance=0.4)
    space = enumerate_candidates(spec, cluster(1, 4), options)
    one = {(k.start, k.end) for k in space.keys if k.submesh_id == 0}
    assert one == {(0, 0), (1, 1), (2, 2), (3, 3)}
    two = {(k.start, k.end) for k in space.keys if k.submesh_id == 1}
    assert two == {(0, 1), (1, 2), (2, 3)}
    # the boundary is inclusive, as in Alpa: with tol = 0.5, 3 layers on (1,2) stay
    loose = enumerate_candidates(
        spec, cluster(1, 4), PlanOptions(strategies=["data"], layer_imbalance_tolerance=0.5)
    )
    assert (0, 2) in {(k.start, k.end) for k in loose.keys if k.submesh_id == 1}
    everything = enumerate_candidates(spec, cluster(1, 4), PlanOptions(strategies=["data"]))
    assert len(everything.keys) > len(loose.keys) > len(space.keys)


def test_candidates_check_the_global_batch() -> None:
    with pytest.raises(ValueError, match="micro-batch"):
        enumerate_candidates(
            programless_chain_spec(2),
            cluster(),
            PlanOptions(num_microbatches=2, global_batch_size=2),
        )


# --- mesh axes -------------------------------------------------------------------------------

from schemas.sharding import (  # noqa: E402
    MAXTEXT_RULES,
    MeshFacts,
    ShardingStrategy,
    mesh_points,
)

ALL_AXES = ["data", "fsdp", "tensor", "context", "expert"]


def _split(points: list[dict[str, int]]) -> set[tuple[tuple[str, int], ...]]:
    return {tuple((a, s) for a, s in p.items() if s > 1) for p in points}


def test_mesh_points_of_four_devices_brute_force() -> None:
    """Every assignment of sizes to the five axes with product 4, filtered by the documented
    rules by hand, equals `mesh_points`."""
    import itertools

    want = set()
    for sizes in itertools.product([1, 2, 4], repeat=5):
        p = dict(zip(["data", "fsdp", "context", "expert", "tensor"], sizes, strict=True))
        if math.prod(sizes) != 4 or sum(s > 1 for s in sizes) > 2:
            continue
        if 8 % (p["data"] * p["fsdp"] * p["expert"]) or (p["data"] > 1 and p["fsdp"] > 1):
            continue
        want.add(tuple((a, s) for a, s in p.items() if s > 1))
    got = mesh_points(1, 4, 8, ALL_AXES)
    assert _split(got) == want and len(got) == len(want) == 14
    assert all(math.prod(p.values()) == 4 for p in got)


def test_mesh_points_keep_tensor_in_a_host_and_data_across_hosts() -> None:
    points = _split(mesh_points(2, 4, 16, ["data", "fsdp", "tensor"]))
    assert (("tensor", 8),) not in points
    assert (("data", 2), ("fsdp", 4)) in points  # MaxText's hybrid: dcn data, ici fsdp
    assert (("data", 4), ("fsdp", 2)) not in points
    assert (("tensor", 8),) in _split(
        mesh_points(2, 4, 16, ["data", "fsdp", "tensor"], tensor_across_hosts=True)
    )
    # the batch axes divide the micro-batch
    assert (("data", 8),) not in _split(mesh_points(2, 4, 4, ["data"]))


def test_context_and_expert_only_where_the_model_has_them() -> None:
    dense = MeshFacts(sequence=False, experts=False)
    lm = MeshFacts(sequence=True, experts=False)
    moe = MeshFacts(sequence=True, experts=True)
    for facts, context, expert in [(dense, False, False), (lm, True, False), (moe, True, True)]:
        points = mesh_points(1, 4, 8, ALL_AXES, facts=facts)
        assert any(p["context"] > 1 for p in points) == context
        assert any(p["expert"] > 1 for p in points) == expert


def test_mesh_configs_follow_todays_strategies_and_carry_the_rules() -> None:
    from planner.choices import all_config_choices

    options = PlanOptions(mesh_axes=["fsdp", "expert"], strategies=["data"])
    configs = all_config_choices((1, 4), 8, options, MeshFacts(sequence=False, experts=True))
    legacy = [c for c in configs if c.is_legacy]
    assert [c.label() for c in legacy] == ["4x1/data"]
    mesh = [c for c in configs if not c.is_legacy]
    assert [c.label() for c in mesh] == [
        "fsdp4/maxtext",
        "expert4/maxtext",
        "fsdp2.expert2/maxtext",
    ]
    assert all(c.rules == dict(MAXTEXT_RULES) and c.logical_mesh == (4, 1) for c in mesh)


def test_user_shardings_go_where_they_fit() -> None:
    from planner.choices import all_config_choices

    mine = ShardingStrategy(name="mine", mesh_axes={"fsdp": -1, "tensor": 2})
    options = PlanOptions(strategies=[], shardings=[mine])
    assert all_config_choices((1, 1), 8, options) == []
    (two,) = all_config_choices((1, 2), 8, options)
    assert two.axis_sizes["tensor"] == 2 and two.axis_sizes["fsdp"] == 1
    (eight,) = all_config_choices((2, 4), 8, options)
    assert (eight.axis_sizes["fsdp"], eight.axis_sizes["tensor"]) == (4, 2)
