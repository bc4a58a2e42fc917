"""The MaxText-restricted search and the trainer exports, on synthetic GPT-like tables.

MaxText's constraints, as `src/MaxText/configs/types.py` (AI-Hypercomputer/maxtext @
1007fc2aa8e1822c009ce5a57187880b74f000cd) checks them when pipelining:
- num_stages = ici_pipeline_parallelism × dcn_pipeline_parallelism;
- num_stages × num_pipeline_repeats × num_layers_per_pipeline_stage == pipeline_parallel_layers;
- num_pipeline_microbatches > 0 and a multiple of num_stages;
- the dcn_* product above 1 only with several slices (here: hosts);
and the mesh (`ici_parallelism` / `dcn_parallelism` lists of the same file) covers the devices:
the product of the ici_* keys is the devices per slice, of the dcn_* keys the slices.
"""

import math

import pytest

from planner.trainers import block_run, maxtext_parallelism, maxtext_remat
from schemas import Plan, ShardingConfig
from schemas.plan import MaxTextPlan
from schemas.trainer_export import (
    ExportUnavailable,
    export_plan,
    jaxpp_export,
    maxtext_export,
    maxtext_gap,
    maxtext_yaml,
)
from tests.planner.helpers import cluster
from tests.planner.trainer_helpers import gpt_plan, gpt_spec

AXES = ("pipeline", "data", "fsdp", "context", "tensor", "expert")
ICI = tuple(f"ici_{a}_parallelism" for a in AXES)
DCN = tuple(f"dcn_{a}_parallelism" for a in AXES)


def check_maxtext_constraints(settings: dict[str, int], hosts: int, per_host: int) -> None:
    stages = settings["ici_pipeline_parallelism"] * settings["dcn_pipeline_parallelism"]
    assert stages >= 2
    assert (
        stages * settings["num_pipeline_repeats"] * settings["num_layers_per_pipeline_stage"]
        == settings["pipeline_parallel_layers"]
    )
    assert settings["num_pipeline_microbatches"] > 0
    assert settings["num_pipeline_microbatches"] % stages == 0
    ici = math.prod(settings[k] for k in ICI)
    dcn = math.prod(settings[k] for k in DCN)
    assert ici == per_host and dcn == hosts
    assert settings.get("remat_policy", "full") in ("full", "minimal")  # MaxText's names
    assert all(isinstance(v, int) and v >= 1 for k, v in settings.items() if k != "remat_policy")


@pytest.mark.parametrize(("blocks", "hosts", "per_host"), [(16, 1, 4), (16, 2, 4), (6, 1, 4)])
def test_maxtext_settings_obey_maxtext(blocks: int, hosts: int, per_host: int) -> None:
    plan = gpt_plan(blocks, hosts, per_host, target="maxtext")
    mt = plan.maxtext
    assert plan.target == "maxtext" and mt is not None and mt.feasible, mt
    check_maxtext_constraints(mt.settings, hosts, per_host)
    assert mt.settings["pipeline_parallel_layers"] == blocks
    assert mt.blocks == (1, blocks) and mt.outside_layers == ["embed", "head"]
    # The chunks tile the blocks in order, uniform, one submesh and config.
    sizes = {b - a + 1 for a, b in mt.chunks}
    assert sizes == {mt.settings["num_layers_per_pipeline_stage"]}
    assert mt.chunks[0][0] == 1 and mt.chunks[-1][1] == blocks
    assert all(x[1] + 1 == y[0] for x, y in zip(mt.chunks, mt.chunks[1:], strict=False))
    assert mt.schedule == ("gpipe" if mt.settings["num_pipeline_repeats"] == 1 else "circular")
    assert mt.predicted_iteration_time_s == pytest.approx(
        mt.pipeline_time_s + mt.outside_time_s, rel=1e-12
    )
    exported = maxtext_export(plan)
    for key, value in mt.settings.items():
        assert f"{key}: {value}\n" in exported["yaml"]
        assert f"{key}={value}" in exported["overrides"].split()
    assert exported["summary"].startswith("MaxText's best:")


def test_prime_block_count_gets_no_wrong_plan() -> None:
    """13 blocks on 4 devices: no 2 or 4 stages divide them; the answer says so."""
    plan = gpt_plan(13, 1, 4, target="maxtext")
    mt = plan.maxtext
    assert mt is not None and not mt.feasible and mt.settings == {}
    assert "no uniform plan of the 13 blocks" in (mt.reason or "")
    assert "do not divide the 13 blocks" in (mt.reason or "")
    with pytest.raises(ExportUnavailable, match="cannot run"):
        maxtext_export(plan)
    assert maxtext_gap(mt).startswith("no MaxText plan")


def test_microbatches_not_a_multiple_drop_those_stages() -> None:
    """6 micro-batches on 4 devices: 4 stages are out, 2 stages (a multiple) remain."""
    plan = gpt_plan(16, 1, 4, micro=6, target="maxtext")
    mt = plan.maxtext
    assert mt is not None and mt.feasible
    assert mt.settings["ici_pipeline_parallelism"] == 2
    check_maxtext_constraints(mt.settings, 1, 4)


def test_block_run_is_the_longest_equal_fingerprint_run() -> None:
    assert block_run(gpt_spec(5)) == (1, 5)
    spec = gpt_spec(3)
    layers = [layer.model_copy(update={"fingerprint": ""}) for layer in spec.layers]
    assert block_run(spec.model_copy(update={"layers": layers})) is None


def test_parallelism_over_hosts_splits_the_outer_axes() -> None:
    from schemas import SubmeshShape

    sub = SubmeshShape(hosts=2, devices_per_host=4)
    ok = maxtext_parallelism(
        sub, ShardingConfig(logical_mesh=(8, 1), strategy="fsdp"), cluster(4, 4)
    )
    assert isinstance(ok, dict)
    assert {k: v for k, v in ok.items() if v != 1} == {
        "dcn_pipeline_parallelism": 2,
        "ici_fsdp_parallelism": 4,
        "dcn_fsdp_parallelism": 2,
    }
    # tensor parallel over 8 devices on 2 hosts was measured across them: dcn_tensor 2
    across = maxtext_parallelism(
        sub, ShardingConfig(logical_mesh=(1, 8), strategy="megatron"), cluster(4, 4)
    )
    assert isinstance(across, dict)
    assert (across["ici_tensor_parallelism"], across["dcn_tensor_parallelism"]) == (4, 2)
    odd = maxtext_parallelism(
        SubmeshShape(hosts=2, devices_per_host=2),
        ShardingConfig(logical_mesh=(4, 1), strategy="data"),
        cluster(2, 4),
    )
    assert isinstance(odd, str) and "does not tile" in odd


@pytest.mark.parametrize(("hosts", "per_host"), [(1, 4), (1, 8), (2, 4), (4, 2)])
def test_maxtext_mesh_covers_the_devices_for_every_mesh_axis_config(
    hosts: int, per_host: int
) -> None:
    """Every config the mesh-axes search (all five axes, tensor across hosts allowed) and
    today's strategies make, on every submesh, gives MaxText keys whose ici product is the
    devices per host and dcn product the hosts, with the measured axis sizes."""
    from planner.choices import all_config_choices, submesh_choices
    from schemas import PlanOptions, SubmeshShape

    options = PlanOptions(
        mesh_axes=["data", "fsdp", "tensor", "context", "expert"], tensor_across_hosts=True
    )
    checked = 0
    for h, d in submesh_choices(hosts, per_host):
        sub = SubmeshShape(hosts=h, devices_per_host=d)
        for config in all_config_choices(sub, 16, options):
            settings = maxtext_parallelism(sub, config, cluster(hosts, per_host))
            assert isinstance(settings, dict), settings
            assert math.prod(settings[k] for k in ICI) == per_host
            assert math.prod(settings[k] for k in DCN) == hosts
            stage_devices = math.prod(settings[k] for k in ICI + DCN if "pipeline" not in k)
            assert stage_devices == sub.num_devices
            for axis, size in config.axis_sizes.items():
                ici, dcn = settings[f"ici_{axis}_parallelism"], settings[f"dcn_{axis}_parallelism"]
                assert ici * dcn == size
            checked += 1
    assert checked > 20


def test_maxtext_target_turns_pruning_off_only_for_the_prune_search() -> None:
    from schemas import PlanOptions

    assert PlanOptions(target="maxtext").search_mode == "estimate"  # verified by estimates
    assert PlanOptions(target="maxtext", search="estimate").search_mode == "estimate"
    assert PlanOptions(target="maxtext", search="prune").search_mode == "exhaustive"
    assert PlanOptions(target="maxtext", search="prune", prune=True).search_mode == "prune"
    assert PlanOptions().prune is True and PlanOptions(target="jaxpp").prune is True
    assert PlanOptions(target="jaxpp").search_mode == "estimate"


def test_a_remat_variant_is_maxtexts_remat_policy_and_as_written_sets_none() -> None:
    """MaxText's `full` saves nothing and `minimal` is checkpoint_dots_with_no_batch_dims
    (`get_remat_policy` in src/MaxText/layers/decoders.py): our `full` and `dots`."""
    data = ShardingConfig(logical_mesh=(1, 1), strategy="data")
    assert maxtext_remat(data) == {}
    assert maxtext_remat(data.model_copy(update={"remat": "full"})) == {"remat_policy": "full"}
    assert maxtext_remat(data.model_copy(update={"remat": "dots"})) == {"remat_policy": "minimal"}
    with_policy = MaxTextPlan(feasible=True, settings={"remat_policy": "minimal"})
    assert "remat_policy: minimal" in maxtext_yaml(with_policy)
    assert "as your model config sets it" not in maxtext_yaml(with_policy)
    assert "as your model config sets it" in maxtext_yaml(MaxTextPlan(feasible=True))


def test_maxtext_export_of_an_unrestricted_plan_is_refused() -> None:
    plan = gpt_plan(6, 1, 4)
    assert plan.target is None and plan.maxtext is None
    with pytest.raises(ExportUnavailable, match="--for maxtext"):
        export_plan(plan, "maxtext")
    old = Plan.model_validate_json(plan.model_dump_json(exclude={"target", "maxtext"}))
    assert old.target is None  # plans stored before read


def _check_marks(plan: Plan) -> None:
    out = jaxpp_export(plan)
    marks = out["stage_marks"]
    assert len(marks) == len(plan.stages)
    names = [layer for s in plan.stages for layer in s.layer_names]
    for i, (mark, stage) in enumerate(zip(marks, plan.stages, strict=True)):
        assert mark["after_layer"] == stage.layer_names[-1]
        # The next stage begins right after the marked layer.
        position = names.index(mark["after_layer"])
        if i + 1 < len(plan.stages):
            assert names[position + 1] == plan.stages[i + 1].layer_names[0]
    assert marks[-1]["after_layer"] == names[-1]  # the final mark closes the last stage
    assert out["num_microbatches"] == plan.num_microbatches
    assert out["snippet"].count("pipeline_enter_stage(x)") == len(plan.stages)


@pytest.mark.parametrize(
    ("schedule", "cls"),
    [
        ("1f1b", "Std1F1B"),
        ("gpipe", "GPipe"),
        ("zb-h1", "ZeroBubble"),
        ("interleaved", "Interleaved1F1B"),
    ],
)
def test_jaxpp_marks_follow_the_stage_boundaries(schedule: str, cls: str) -> None:
    plan = gpt_plan(6, 1, 4, schedule=schedule, target="jaxpp")
    _check_marks(plan)
    out = jaxpp_export(plan)
    assert out["schedule"]["class"] == cls
    assert out["schedule"]["args"]["num_stages"] == len(plan.stages)
    if schedule == "interleaved":
        assert out["schedule"]["args"]["mpmd_dim"] == plan.num_device_groups
        assert [m["device_group"] for m in out["stage_marks"]] == [
            s.device_group for s in plan.stages
        ]


@pytest.mark.parametrize(
    ("blocks", "hosts", "per_host", "micro"),
    [(4, 1, 2, 4), (6, 2, 2, 4), (7, 1, 8, 8), (8, 2, 2, 6), (9, 4, 2, 4), (8, 1, 8, 4)],
)
def test_every_maxtext_answer_is_valid_or_says_why(
    blocks: int, hosts: int, per_host: int, micro: int
) -> None:
    plan = gpt_plan(blocks, hosts, per_host, micro=micro, target="maxtext")
    mt = plan.maxtext
    assert mt is not None
    if mt.feasible:
        check_maxtext_constraints(mt.settings, hosts, per_host)
        assert mt.settings["num_pipeline_microbatches"] == micro
        assert mt.settings["pipeline_parallel_layers"] == blocks
    else:
        assert mt.reason and not mt.settings
