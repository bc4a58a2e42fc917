"""Which remat-variant candidates are worth measuring.

A candidate whose config runs its layers under a remat variant (`ShardingConfig.remat` other
than as_written) can only help where memory binds: its as-written sibling (same layers,
submesh and sharding) is measured (or pruned) first, and the variant is measured only when
that sibling ran out of memory, or keeps too little room for the micro-batches some schedule
considered would stash on it. The room asked per schedule, in Alpa's `max_n_succ_stages` (how many
stages may follow before the stage's activations overflow; `q` = how many stages can follow
it, at most one per remaining layer and device):
- `1f1b`: `q` (it keeps `q + 1` micro-batches);
- `zb-h1`: `q + 1` (one more for the weight stashes it keeps beside them);
- `gpipe`, `interleaved`: `B - 1` (every micro-batch in flight, the conservative bound);
  always considered for `target: maxtext` (MaxText runs GPipe or circular).
"""

from collections.abc import Mapping

from planner.candidates import CandidateSpace
from planner.dp import training_dp
from planner.table import CostTable, Key
from schemas import ClusterSpec, PlanOptions, ProfileStatus, StageProfileResult

SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1")


def as_written_sibling(space: CandidateSpace, key: Key) -> Key | None:
    """The as-written candidate of a remat-variant candidate's stage (None for an
    as-written candidate)."""
    start, end, m, c = key
    config = space.configs[m][c]
    if config.remat == "as_written":
        return None
    plain = config.model_copy(update={"remat": "as_written"})
    for c2, other in enumerate(space.configs[m]):
        if other == plain:
            return (start, end, m, c2)
    return None


def room_needed(
    key: Key, space: CandidateSpace, num_layers: int, num_devices: int, options: PlanOptions
) -> int:
    """The `max_n_succ_stages` a stage needs under every schedule `options` considers."""
    _, end, m, _ = key
    follow = max(0, min(num_layers - 1 - end, num_devices - space.submeshes[m].num_devices))
    considered = SCHEDULES if options.schedule == "auto" else (options.schedule,)
    if options.target == "maxtext":  # MaxText's plan runs GPipe or circular (interleaved)
        considered = (*considered, "gpipe", "interleaved")
    need = {
        "1f1b": follow,
        "zb-h1": follow + 1,
        "gpipe": options.num_microbatches - 1,
        "interleaved": options.num_microbatches - 1,
    }
    return max(need[s] for s in considered)


def remat_worth_measuring(
    key: Key,
    space: CandidateSpace,
    results: Mapping[Key, StageProfileResult],
    num_layers: int,
    cluster: ClusterSpec,
    options: PlanOptions,
) -> bool:
    """Whether a candidate is worth measuring as far as remat goes: every as-written one is;
    a variant when its as-written sibling ran out of memory or has no room on `cluster`'s
    devices (see the module doc; a sibling another job measured is judged on this job's
    device memory). Call it once the as-written stages are settled: a sibling without a
    result was pruned (it cannot be in a better plan, and the variant, recomputing, takes no
    less), and one that failed otherwise (compile error...) rules the variant out too."""
    sibling = as_written_sibling(space, key)
    if sibling is None:
        return True
    result = results.get(sibling)
    if result is None:  # pruned: it cannot be in a better plan, and the variant is slower
        return False
    if result.status == ProfileStatus.oom:
        return True
    if not result.ok:
        return False
    need = room_needed(key, space, num_layers, cluster.num_devices, options)
    room = result.for_device_memory(cluster.device_memory_bytes).max_n_succ_stages
    return room < need


def memory_misses(
    table: CostTable, space: CandidateSpace, num_devices: int, num_microbatches: int
) -> str:
    """The fastest 1F1B plan with memory ignored, and per stage by how many bytes it misses
    its device memory (keeping one micro-batch per stage after it, plus its own): what no
    variant could fit. Empty when there is no such plan either."""
    dp = training_dp(
        table.dp_cost,
        None,
        [s.as_tuple() for s in space.submeshes],
        num_devices,
        num_microbatches,
    )
    if not dp.feasible:
        return ""
    parts = []
    n = len(dp.stages)
    for p, key in enumerate(dp.stages):
        need = float(table.fixed_bytes[key] + (n - p) * table.intermediate[key])
        miss = need - float(table.available[key])
        remat = space.configs[key[2]][key[3]].remat
        verdict = f"misses by {miss / 2**20:.1f} MiB" if miss > 0 else "fits"
        parts.append(f"layers {key[0]}-{key[1]} ({remat}) {verdict}")
    return "the fastest plan with memory ignored: " + ", ".join(parts)
