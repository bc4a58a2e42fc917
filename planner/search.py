"""Search per schedule, chosen by simulated time.

Each schedule's search is exact for that schedule's closed-form objective under its memory
rule, and proposes its best few plans; the simulator of the schedule re-ranks them, so the
plan a search answers with is never slower in simulated time than its runner-up.

- `1f1b`: Alpa's DP (`planner.dp`), `Σt + (B-1)·max t`, a stage with `q` stages after it
  keeps `q + 1` micro-batches (`max_n_succ_stages >= q`); proposals: the DP's plan, its
  runner-up (`planner.runner_up`) and every plan of its bound walk.
- `gpipe`: the same objective; every stage keeps all B micro-batches
  (`max_n_succ_stages >= B - 1`).
- `zb-h1`: `Σ(F + B) + (B_mb - 1)·max(F + B + W)` with B and W the split backward's measured
  halves; a stage with `q` after it keeps at most `q + 1` activations and as many weight
  stashes: `(q + 1)·(intermediate + weight_stash) <= free`. The simulated plan is then
  checked against the memory its simulation keeps (a proposal that exceeds it is dropped).
- `interleaved`: `p` device groups of one submesh shape, `v` chunks each, chunk `k` on group
  `k mod p`, `p·v` chunk boundaries: `Σ t_k / v + (v·B - 1)·max t_k` (the uniform case's
  `(v·B + p - 1)·t` exactly); chunk `k` keeps the micro-batches Megatron's order gives it
  (`interleaved_in_flight`) within `1/v` of its group's memory. Every submesh shape that
  splits the devices into `p >= 2` groups with `B` a multiple of `p`, and every `v >= 2`
  (or the one asked for) with `p·v <= L`, is searched.
"""

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from planner.candidates import CandidateSpace
from planner.dp import DPResult, _BoundSearch
from planner.dp_inputs import _prepare
from planner.runner_up import runner_up_dp
from planner.schedule import Schedule, interleaved_in_flight, simulate
from planner.sum_max_dp import sum_max_dp
from planner.table import CostTable, Key
from schemas.plan import MAX_VIRTUAL_STAGES

TOP = 6  # proposals of one search re-ranked by simulation
VARIANT_SLACK = 1.25  # interleaved: each (shape, v)'s best within this of the best objective
NOT_SPLIT = (
    "not measured: the backward was not measured split into B (input gradients) and W "
    "(weight gradients); plan with schedule auto or zb-h1 to measure it"
)


@dataclass(frozen=True)
class Proposal:
    """A plan a search proposes, as simulated under its schedule.

    `memory[s]`: predicted bytes per device of stage `s`'s device group under the schedule.
    `outside`: the one-layer stages of layers run on every device outside the pipeline
    (`planner.outside`), whose `outside_s` seconds add to the pipeline's simulated time.
    """

    keys: list[Key]
    proxy: float
    virtual_stages: int
    num_groups: int
    schedule: Schedule
    memory: list[float]
    fits: bool
    outside: tuple[Key, ...] = ()
    outside_s: float = 0.0

    @property
    def time(self) -> float:
        return self.schedule.iteration_time_s + self.outside_s


@dataclass
class ScheduleSearch:
    """One schedule's answer: its proposals by simulated time (best first), or why none."""

    name: str
    ranked: list[Proposal] = field(default_factory=list)
    reason: str | None = None
    seconds: float = 0.0

    @property
    def best(self) -> Proposal | None:
        return self.ranked[0] if self.ranked else None


def stage_times(
    table: CostTable, name: str, keys: Sequence[Key]
) -> tuple[list[float], list[float], list[float] | None]:
    """Forward, backward (B for zb-h1) and W (zb-h1 only) seconds of each stage."""
    if name == "zb-h1":
        split = [table.split_seconds(k) for k in keys]
        return [f for f, _, _ in split], [b for _, b, _ in split], [w for _, _, w in split]
    times = [table.stage_seconds(k) for k in keys]
    return [f for f, _ in times], [b for _, b in times], None


def simulate_keys(
    table: CostTable, name: str, keys: Sequence[Key], micro: int, groups: int | None = None
) -> Schedule:
    """The schedule `name` of these stages (chunks), simulated."""
    forward, backward, weight = stage_times(table, name, keys)
    return simulate(name, forward, backward, micro, weight, groups)


def schedule_memory(
    table: CostTable, name: str, keys: Sequence[Key], sched: Schedule, groups: int
) -> tuple[list[float], bool]:
    """Per stage, the predicted bytes per device of its device group under the schedule
    (peak + parameters and optimizer state + what the kept micro-batches stash), and whether
    every stage fits its schedule's rule."""
    acts, stashes = sched.max_activations, sched.max_weight_stashes
    per_stage = [
        float(table.fixed_bytes[k] + acts[s] * table.intermediate[k])
        + (float(stashes[s] * table.weight_stash[k]) if name == "zb-h1" else 0.0)
        for s, k in enumerate(keys)
    ]
    if name == "interleaved":
        load = [0.0] * groups
        for s, value in enumerate(per_stage):
            load[s % groups] += value
        memory = [load[s % groups] for s in range(len(keys))]
        fits = all(memory[s] <= table.available[k] for s, k in enumerate(keys))
        return memory, fits
    if name == "zb-h1":
        fits = all(per_stage[s] <= table.available[k] for s, k in enumerate(keys))
    else:
        fits = all(acts[s] <= int(table.max_n_succ_stages[k]) + 1 for s, k in enumerate(keys))
    return per_stage, fits


def _flat(arr: NDArray[np.float64]) -> NDArray[np.float64]:
    """`[L, L, S, C]` -> `[L, L, S * C]` (choice `k = m * C + c`)."""
    n = arr.shape[0]
    return arr.reshape(n, n, -1)


def _key(stage: tuple[int, int, int], num_configs: int) -> Key:
    i, e, k = stage
    return (i, e, k // num_configs, k % num_configs)


def _rows(level: NDArray[np.int64], usable: NDArray[np.bool_], cap: int) -> NDArray[np.bool_]:
    """`allow[q]` = `level >= q` for the rows that bind (the last row: every q past them)."""
    clipped = np.clip(level, -1, cap)
    binding = clipped[usable & (clipped < cap)]
    rows = int(binding.max()) + 2 if binding.size else 1
    rows = max(1, min(rows, cap + 1))
    return np.stack([clipped >= q for q in range(rows)]) & usable[None]


def _one_f_one_b(
    table: CostTable, shapes: list[tuple[int, int]], devices: int, micro: int, ranks: NDArray
) -> list[tuple[float, list[Key]]]:
    prepared = _prepare(table.dp_cost, table.max_n_succ_stages, shapes, devices, ranks)
    walk = _BoundSearch(prepared, micro)
    walk.run()
    if not walk.found:
        return []
    cost, best = walk.result()
    chosen = DPResult(cost=cost, stages=best, table=prepared)
    other = runner_up_dp(table.dp_cost, table.max_n_succ_stages, shapes, devices, micro, chosen)
    out = [(cost, list(best))]
    if other.feasible:
        out.append((other.cost, list(other.stages)))
    out.extend((c, list(s)) for c, s in sorted(walk.found, key=lambda t: t[0]))
    return out


def _gpipe(
    table: CostTable, sizes: NDArray[np.int64], devices: int, micro: int
) -> list[tuple[float, list[Key]]]:
    cost = _flat(table.dp_cost)
    allow = (_flat(table.max_n_succ_stages.astype(np.float64)) >= micro - 1)[None]
    allow &= np.isfinite(cost)[None]
    result = sum_max_dp(cost, cost, allow, sizes, devices, micro - 1)
    num_configs = table.dp_cost.shape[3]
    return [(v, [_key(s, num_configs) for s in plan]) for v, plan in result.found]


def _zero_bubble(
    table: CostTable, sizes: NDArray[np.int64], devices: int, micro: int
) -> list[tuple[float, list[Key]]]:
    comm = (table.comm_forward + table.comm_backward)[..., None]
    a = _flat(table.forward + table.input_grad + comm)
    b = a + _flat(table.weight_grad)
    usable = np.isfinite(b)
    stash = _flat(table.intermediate + table.weight_stash)
    with np.errstate(divide="ignore", invalid="ignore"):
        level = np.where(stash > 0, np.floor(_flat(table.free_bytes) / stash) - 1, float(2**40))
    level = np.where(_flat(table.free_bytes) < 0, -1, level)
    cap = min(a.shape[0], devices) - 1
    allow = _rows(np.clip(level, -1, cap).astype(np.int64), usable, cap)
    result = sum_max_dp(a, b, allow, sizes, devices, micro - 1)
    num_configs = table.dp_cost.shape[3]
    return [(v, [_key(s, num_configs) for s in plan]) for v, plan in result.found]


def _interleaved(
    table: CostTable,
    shapes: list[tuple[int, int]],
    devices: int,
    micro: int,
    virtual_stages: int | None,
) -> tuple[list[tuple[float, list[Key], int, int]], list[str]]:
    """Proposals (objective, keys, v, p) over every shape and v, and why shapes were skipped."""
    num_layers, num_configs = table.dp_cost.shape[0], table.dp_cost.shape[3]
    out: list[tuple[float, list[Key], int, int]] = []
    why: list[str] = []
    for m, (hosts, per_host) in enumerate(shapes):
        size = hosts * per_host
        if devices % size or devices // size < 2:
            continue
        p = devices // size
        if micro % p:
            why.append(f"{p} groups of {hosts}x{per_host}: {micro} micro-batches not a multiple")
            continue
        if virtual_stages is not None:
            choices = [virtual_stages]
        else:
            choices = list(range(2, max(2, min(num_layers // p, MAX_VIRTUAL_STAGES)) + 1))
        for v in choices:
            chunks = p * v
            if chunks > num_layers:
                why.append(f"{p} groups x {v} chunks exceed the {num_layers} layers")
                continue
            t = table.dp_cost[:, :, m, :]
            kept = interleaved_in_flight(p, v, micro)
            budget = table.available[:, :, m, :] / v - table.fixed_bytes[:, :, m, :]
            allow = (
                np.stack(
                    [
                        kept[chunks - 1 - q] * table.intermediate[:, :, m, :] <= budget
                        for q in range(chunks)
                    ]
                )
                & np.isfinite(t)[None]
            )
            best = min((value for value, *_ in out), default=math.inf)
            no_devices = np.zeros(num_configs, dtype=np.int64)
            result = sum_max_dp(t / v, t, allow, no_devices, 0, micro * v - 1, chunks, best)
            if not result.feasible:
                why.append(
                    f"{p} groups of {hosts}x{per_host}, {v} chunks each: no measured chunks "
                    "cover the layers within memory"
                )
            for value, plan in result.found[:TOP]:
                out.append((value, [(i, e, m, c) for i, e, c in plan], v, p))
    return out, why


def proposals(
    name: str,
    table: CostTable,
    space: CandidateSpace,
    num_devices: int,
    micro: int,
    config_rank: NDArray[np.int64],
    virtual_stages: int | None = None,
) -> tuple[list[tuple[float, list[Key], int, int]], str | None]:
    """What the schedule's search proposes, `(objective, keys, v, device groups)`, its best
    first (interleaved: best first per submesh shape and v), or why it proposes nothing."""
    shapes = [s.as_tuple() for s in space.submeshes]
    num_configs = table.dp_cost.shape[3]
    sizes = np.repeat(np.array([h * d for h, d in shapes], dtype=np.int64), num_configs)
    if name == "1f1b":
        plans = _one_f_one_b(table, shapes, num_devices, micro, config_rank)
        return [(c, k, 1, len(k)) for c, k in plans], None
    if name == "gpipe":
        return [(c, k, 1, len(k)) for c, k in _gpipe(table, sizes, num_devices, micro)], None
    if name == "zb-h1":
        if not np.isfinite(table.input_grad + table.weight_grad).any():
            return [], NOT_SPLIT
        plans = _zero_bubble(table, sizes, num_devices, micro)
        return [(c, k, 1, len(k)) for c, k in plans], None
    if name == "interleaved":
        found, why = _interleaved(table, shapes, num_devices, micro, virtual_stages)
        reason = "; ".join(why) or (
            "no submesh shape splits the devices into 2 or more equal device groups"
        )
        return found, None if found else reason
    raise ValueError(f"unknown schedule {name!r}")


def search_schedule(
    name: str,
    table: CostTable,
    space: CandidateSpace,
    num_devices: int,
    micro: int,
    config_rank: NDArray[np.int64],
    virtual_stages: int | None = None,
) -> ScheduleSearch:
    """The schedule's best plans by simulated time (see the module docstring)."""
    began = time.perf_counter()
    found, reason = proposals(name, table, space, num_devices, micro, config_rank, virtual_stages)
    ranked = rank(table, name, found, micro)
    if not ranked and reason is None:
        reason = (
            "no plan fits the schedule's memory rule"
            if found
            else "no combination of measured stages fits the schedule's memory rule on all devices"
        )
    return ScheduleSearch(
        name=name,
        ranked=ranked,
        reason=reason,
        seconds=time.perf_counter() - began,
    )


def rank(
    table: CostTable, name: str, found: list[tuple[float, list[Key], int, int]], micro: int
) -> list[Proposal]:
    """The first `TOP` distinct proposals (interleaved: the `TOP` best objectives over every
    shape and v, and each (shape, v)'s best within `VARIANT_SLACK` of the best), simulated;
    those that fit memory ordered by (simulated time, objective, proposal order)."""
    seen: set[tuple[Key, ...]] = set()
    per_variant: dict[tuple[int, int], int] = {}
    proposals: list[tuple[float, float, int, Proposal]] = []
    # Several variants (interleaved: submesh shapes and v): the best TOP objectives over all
    # of them, and each variant's best within VARIANT_SLACK of the best objective.
    best = min((value for value, *_ in found), default=math.inf)
    ordered = sorted(range(len(found)), key=lambda j: found[j][0])
    top = set(ordered[:TOP])
    for order, (value, keys, v, p) in enumerate(found):
        first = per_variant.get((v, p), 0) == 0
        wanted = order in top or (first and value <= VARIANT_SLACK * best)
        if name != "interleaved":
            wanted = per_variant.get((v, p), 0) < TOP
        if tuple(keys) in seen or not wanted:
            continue
        seen.add(tuple(keys))
        per_variant[(v, p)] = per_variant.get((v, p), 0) + 1
        groups = p if name == "interleaved" else len(keys)
        sched = simulate_keys(table, name, keys, micro, groups)
        memory, fits = schedule_memory(table, name, keys, sched, groups)
        if not fits:
            continue
        prop = Proposal(keys, value, v, groups, sched, memory, fits)
        proposals.append((_round(sched.iteration_time_s), value, order, prop))
    proposals.sort(key=lambda t: t[:3])
    return [t[3] for t in proposals]


def _round(seconds: float) -> float:
    """Simulated times equal up to rounding compare equal (then the objective decides)."""
    return float(f"{seconds:.12g}") if math.isfinite(seconds) else seconds
