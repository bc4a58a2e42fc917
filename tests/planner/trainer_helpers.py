"""A GPT-like synthetic model (embed, equal blocks, head), a measured table for it, and
MaxText's own constraints on the settings of a plan made for it."""

import math

from planner import build_plan, enumerate_candidates
from schemas import ModelSpec, Plan, PlanOptions
from tests.planner.helpers import cluster, split_result
from tests.planner.helpers import programless_chain_spec as chain_spec

LAYER_COST = {"embed": 0.4, "block": 1.0, "head": 1.6}


def gpt_spec(blocks: int) -> ModelSpec:
    """embed, block0..block{n-1}, head: the blocks share one fingerprint."""
    spec = chain_spec(blocks + 2)
    names = ["embed", *(f"block{i}" for i in range(blocks)), "head"]
    layers = [
        layer.model_copy(update={"name": n, "fingerprint": n.rstrip("0123456789")})
        for layer, n in zip(spec.layers, names, strict=True)
    ]
    return spec.model_copy(update={"layers": layers})


def layer_cost(name: str) -> float:
    return LAYER_COST[name.rstrip("0123456789")]


def gpt_plan(blocks: int, hosts: int, per_host: int, micro: int = 8, **options) -> Plan:
    """The plan of `gpt_spec(blocks)` on hosts × per_host devices, from a table where a stage
    takes its layers' cost over its devices plus 5% per device of communication overhead."""
    spec = gpt_spec(blocks)
    clus = cluster(hosts, per_host)
    opts = PlanOptions(num_microbatches=micro, **options)
    space = enumerate_candidates(spec, clus, opts)
    results = {}
    for key in space.keys:
        submesh, config = space.resolve(key)
        work = sum(layer_cost(spec.layers[i].name) for i in range(key.start, key.end + 1))
        n = submesh.num_devices
        slow = 1.0 + 0.05 * (n - 1) + (0.02 if config.strategy != "data" else 0.0)
        f = work * slow / n * 1e-3
        results[key.as_tuple()] = split_result(
            submesh, config, f, f, f, num_layers=key.end - key.start + 1
        )
    return build_plan(spec, clus, opts, space, results)


ICI = ("ici_pipeline_parallelism", "ici_data_parallelism", "ici_fsdp_parallelism")
DCN = ("dcn_pipeline_parallelism", "dcn_data_parallelism", "dcn_fsdp_parallelism")


def check_maxtext_constraints(settings: dict[str, int | str], hosts: int, per_host: int) -> None:
    """MaxText's constraints, as `src/MaxText/configs/types.py` checks them when pipelining
    (AI-Hypercomputer/maxtext @ 0035497a3061c509c853bdb5b8f3322e3cb7d696, the same as
    @ 1007fc2aa8e1822c009ce5a57187880b74f000cd):
    - num_stages = ici_pipeline_parallelism × dcn_pipeline_parallelism;
    - num_stages × num_pipeline_repeats × num_layers_per_pipeline_stage ==
      pipeline_parallel_layers;
    - num_pipeline_microbatches > 0 and a multiple of num_stages;
    - the dcn_* product above 1 only with several slices (here: hosts);
    and the mesh (the `ici_parallelism` / `dcn_parallelism` lists of the same file) covers
    the devices: the product of the ici_* keys is the devices per slice, of the dcn_* keys
    the slices."""
    ints = {k: v for k, v in settings.items() if isinstance(v, int)}
    stages = ints["ici_pipeline_parallelism"] * ints["dcn_pipeline_parallelism"]
    assert stages >= 2
    assert (
        stages * ints["num_pipeline_repeats"] * ints["num_layers_per_pipeline_stage"]
        == ints["pipeline_parallel_layers"]
    )
    assert ints["num_pipeline_microbatches"] > 0
    assert ints["num_pipeline_microbatches"] % stages == 0
    ici = math.prod(ints[k] for k in ICI) * ints["ici_tensor_parallelism"]
    dcn = math.prod(ints[k] for k in DCN)
    assert ici == per_host and dcn == hosts
    assert dcn == 1 or hosts > 1
    assert settings.get("remat_policy", "full") in ("full", "minimal")  # MaxText's names
    assert all(v >= 1 for v in ints.values())
    assert set(settings) - set(ints) <= {"remat_policy"}
