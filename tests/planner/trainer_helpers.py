"""A GPT-like synthetic model (embed, equal blocks, head) and a measured table for it."""

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
