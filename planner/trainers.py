"""The best plan MaxText can run, searched on the measured table.

MaxText pipelines only its repeated decoder blocks, in uniform stages of one submesh shape
and one sharding config, under GPipe (`num_pipeline_repeats=1`) or its circular schedule
(repeats `r > 1`, simulated as interleaved 1F1B with `v = r`); stages × repeats × layers
per stage = the pipelined layers and the micro-batches a multiple of the stages. The layers
before and after the blocks (embedding, head) run on all devices outside the pipeline: each
is costed from its fastest one-layer stage on the largest submesh that measured it, scaled
to data parallelism over all devices (`time × submesh devices / all devices`, per
micro-batch): a measurement where the whole cluster measured it (`outside_layers`,
`planner.with_layers_outside`), an ideal-scaling estimate otherwise, since Alpa's candidate
space holds only the whole model on the whole cluster.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.candidates import CandidateSpace
from planner.search import schedule_memory, simulate_keys
from planner.table import CostTable, Key
from schemas import ClusterSpec, ModelSpec, PlannedStage, ShardingConfig, SubmeshShape
from schemas.plan import MaxTextPlan
from schemas.sharding import MESH_AXES, axes_label

# Our mesh axes in MaxText's `mesh_axes` order; each is MaxText's `ici_<axis>_parallelism` /
# `dcn_<axis>_parallelism` (src/maxtext/configs/base.yml, AI-Hypercomputer/maxtext @ e591f30).
MAXTEXT_AXES = ("data", "fsdp", "context", "tensor", "expert")


def block_run(spec: ModelSpec) -> tuple[int, int] | None:
    """First and last layer of the longest run of consecutive layers with equal (non-empty)
    fingerprints, at least two long (the first such run on ties); None when there is none."""
    best: tuple[int, int] | None = None
    start = 0
    layers = spec.layers
    for i in range(1, len(layers) + 1):
        if (
            i < len(layers)
            and layers[i].fingerprint
            and layers[i].fingerprint == layers[start].fingerprint
        ):
            continue
        if i - start >= 2 and layers[start].fingerprint:
            if best is None or i - start > best[1] - best[0] + 1:
                best = (start, i - 1)
        start = i
    return best


# MaxText's `remat_policy` for a remat variant (`full`: nothing saved, recompute the layer;
# `dots`: matmul outputs without batch dims saved = MaxText's `minimal`, which is
# `jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims` in
# `src/MaxText/layers/decoders.py` `get_remat_policy`, AI-Hypercomputer/maxtext). The
# as-written variant sets nothing: the model's own policy stays.
MAXTEXT_REMAT_POLICY = {"full": "full", "dots": "minimal"}


def maxtext_remat(config: ShardingConfig) -> dict[str, str]:
    """The `remat_policy` setting of stages run under `config`'s remat variant, if any."""
    policy = MAXTEXT_REMAT_POLICY.get(config.remat)
    return {} if policy is None else {"remat_policy": policy}


def maxtext_parallelism(
    submesh: SubmeshShape, config: ShardingConfig, cluster: ClusterSpec
) -> dict[str, int] | str:
    """The `ici_*` / `dcn_*` MaxText keys of uniform stages on `submesh` with `config`, from
    the mesh axes the stages were measured on (`ShardingConfig.axis_sizes`; today's
    strategies are points of that space): hosts are DCN slices, devices per host ICI. A stage
    on several hosts splits its outermost axes over them, as its mesh lays devices out
    (`schemas.sharding.MESH_AXES`, data first); a string says why when not expressible."""
    hosts, per_host = cluster.num_hosts, cluster.devices_per_host
    h, d = submesh.as_tuple()
    if (h == 1 and per_host % d) or (h > 1 and (d != per_host or hosts % h)):
        return f"the {h}x{d} submesh does not tile the {hosts}x{per_host} devices as MaxText's mesh"
    sizes = config.axis_sizes
    dcn = dict.fromkeys(MESH_AXES, 1)
    left = h
    for axis in MESH_AXES:
        dcn[axis] = math.gcd(sizes[axis], left)
        left //= dcn[axis]
    if left != 1:
        return f"its mesh axes {axes_label(sizes)} do not split over {h} hosts"
    settings = {
        "ici_pipeline_parallelism": per_host // d if h == 1 else 1,
        "dcn_pipeline_parallelism": hosts if h == 1 else hosts // h,
    }
    for axis in MAXTEXT_AXES:
        settings[f"ici_{axis}_parallelism"] = sizes[axis] // dcn[axis]
        settings[f"dcn_{axis}_parallelism"] = dcn[axis]
    return settings


@dataclass(frozen=True)
class MaxTextCandidate:
    """One MaxText-expressible plan: uniform chunks of the blocks on one submesh and config,
    `repeats` rounds of the stages (1: GPipe, more: circular), simulated."""

    time: float  # pipeline + outside, seconds per iteration
    pipeline: float
    keys: list[Key]
    repeats: int
    settings: dict[str, int | str]


@dataclass(frozen=True)
class MaxTextSpace:
    """Every MaxText-expressible plan of a table, fastest first, with what they share: the
    block run, the layers outside it and their time (and the one-layer stages it is costed
    from), or why there is none."""

    run: tuple[int, int] | None
    outside: list[int]
    outside_time: float
    outside_keys: list[Key]
    ranked: list[MaxTextCandidate]
    reason: str = ""

    def keys_of(self, candidate: MaxTextCandidate) -> list[Key]:
        """The stages the candidate's time rests on: its chunks and the outside layers'."""
        return [*candidate.keys, *self.outside_keys]


def _outside_time(
    table: CostTable, space: CandidateSpace, layers: Sequence[int], devices: int, micro: int
) -> tuple[float, list[Key], str | None]:
    total = 0.0
    keys: list[Key] = []
    by_size = sorted(range(len(space.submeshes)), key=lambda m: -space.submeshes[m].num_devices)
    for i in layers:
        cost = table.forward[i, i] + table.backward[i, i]  # [S, C]
        best = math.inf
        for m in by_size:
            if cost[m].size and math.isfinite(float(cost[m].min())):
                c = int(cost[m].argmin())
                best = float(cost[m, c]) * space.submeshes[m].num_devices / devices
                keys.append((i, i, m, c))
                break
        if not math.isfinite(best):
            return math.inf, keys, f"layer {i} has no measured one-layer stage to cost it outside"
        total += best * micro
    return total, keys, None


def _chunk_keys(first: int, blocks: int, chunks: int, m: int, c: int) -> list[Key]:
    k = blocks // chunks
    return [(first + j * k, first + (j + 1) * k - 1, m, c) for j in range(chunks)]


def maxtext_space(
    spec: ModelSpec, cluster: ClusterSpec, space: CandidateSpace, table: CostTable, micro: int
) -> MaxTextSpace:
    """Every MaxText-expressible plan on `table` that fits its schedule's memory rule,
    fastest first (ties: the order tried), or the reasons there is none."""
    devices = cluster.num_devices
    run = block_run(spec)
    if run is None:
        none = "no repeated blocks: no two consecutive layers share a fingerprint"
        return MaxTextSpace(None, [], math.inf, [], [], none)
    first, last = run
    blocks = last - first + 1
    outside = [i for i in range(spec.num_layers) if not first <= i <= last]
    outside_time, outside_keys, missing = _outside_time(table, space, outside, devices, micro)
    if missing:
        return MaxTextSpace(run, outside, math.inf, outside_keys, [], missing)
    found: list[MaxTextCandidate] = []
    tried: list[str] = []
    for m, sub in enumerate(space.submeshes):
        n = sub.num_devices
        stages = devices // n
        if devices % n or stages < 2:
            continue
        if micro % stages:
            tried.append(f"{stages} stages: {micro} micro-batches are not a multiple")
            continue
        repeats = [r for r in range(1, blocks // stages + 1) if blocks % (stages * r) == 0]
        if not repeats:
            tried.append(f"{stages} stages do not divide the {blocks} blocks")
            continue
        for c, config in enumerate(space.configs[m]):
            keys_ok = False
            par = maxtext_parallelism(sub, config, cluster)
            if isinstance(par, str):
                tried.append(f"{config.label()} on {stages} stages: {par}")
                continue
            for r in repeats:
                keys = _chunk_keys(first, blocks, stages * r, m, c)
                if not all(math.isfinite(float(table.dp_cost[k])) for k in keys):
                    continue
                keys_ok = True
                name = "gpipe" if r == 1 else "interleaved"
                sched = simulate_keys(table, name, keys, micro, stages)
                _, fits = schedule_memory(table, name, keys, sched, stages)
                if not fits:
                    tried.append(
                        f"{stages} stages × {r} repeats on {config.label()}: out of memory"
                    )
                    continue
                settings: dict[str, int | str] = {
                    **par,
                    "num_layers_per_pipeline_stage": blocks // (stages * r),
                    "num_pipeline_repeats": r,
                    "num_pipeline_microbatches": micro,
                    "pipeline_parallel_layers": blocks,
                    **maxtext_remat(config),
                }
                total = sched.iteration_time_s + outside_time
                found.append(MaxTextCandidate(total, sched.iteration_time_s, keys, r, settings))
            if not keys_ok:
                tried.append(
                    f"{stages} stages on {config.label()}: "
                    "uniform chunks not measured (pruned) or failed"
                )
    ranked = sorted(found, key=lambda x: round(x.time, 15))  # stable: first tried wins ties
    reason = ""
    if not ranked:
        why = "; ".join(tried) or "no submesh splits the devices into 2 or more stages"
        reason = f"no uniform plan of the {blocks} blocks ({why})"
    return MaxTextSpace(run, outside, outside_time, outside_keys, ranked, reason)


def maxtext_search(
    spec: ModelSpec,
    cluster: ClusterSpec,
    space: CandidateSpace,
    table: CostTable,
    micro: int,
    unrestricted: Sequence[PlannedStage],
    unrestricted_time: float,
    unrestricted_schedule: str,
) -> MaxTextPlan:
    """The fastest MaxText-expressible plan (simulated), or why there is none."""
    found = maxtext_space(spec, cluster, space, table, micro)
    if found.run is None:
        return MaxTextPlan(
            feasible=False, reason=found.reason, unrestricted_time_s=unrestricted_time
        )
    base = {
        "blocks": found.run,
        "outside_layers": [spec.layers[i].name for i in found.outside],
        "unrestricted_time_s": unrestricted_time,
    }
    if not found.ranked:
        return MaxTextPlan(feasible=False, reason=found.reason, **base)  # type: ignore[arg-type]
    best = found.ranked[0]
    m, c = best.keys[0][2], best.keys[0][3]
    return MaxTextPlan(
        feasible=True,
        settings=best.settings,
        schedule="gpipe" if best.repeats == 1 else "circular",
        chunks=[(k[0], k[1]) for k in best.keys],
        submesh=space.submeshes[m],
        config=space.configs[m][c],
        predicted_iteration_time_s=best.time,
        pipeline_time_s=best.pipeline,
        outside_time_s=found.outside_time,
        not_expressible=not_expressible(unrestricted, unrestricted_schedule, found.run),
        **base,  # type: ignore[arg-type]
    )


def not_expressible(
    stages: Sequence[PlannedStage], schedule: str, run: tuple[int, int]
) -> list[str]:
    """What the unrestricted plan does that MaxText cannot express."""
    out = []
    counts = {s.end - s.start + 1 for s in stages}
    if len(counts) > 1:
        out.append(
            "its stages hold uneven layer counts ("
            + ", ".join(str(s.end - s.start + 1) for s in stages)
            + ")"
        )
    if len({s.submesh.as_tuple() for s in stages}) > 1:
        out.append("its stages use submeshes of different shapes")
    if len({s.config.label() for s in stages}) > 1:
        out.append("its stages use different sharding configs")
    if any(s.start < run[0] <= s.end or s.start <= run[1] < s.end for s in stages):
        out.append("it pipelines the embedding or head together with blocks")
    if schedule in ("1f1b", "zb-h1"):
        out.append(f"it uses the {schedule} schedule (MaxText runs GPipe or circular)")
    return out
