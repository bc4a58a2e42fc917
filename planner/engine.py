"""The event-simulation engine every schedule model runs on.

A pipeline of `S` stages (model chunks) runs on `G` device groups; stage `k` runs on group
`group_of[k]`. Each micro-batch `i` has a forward `F(k, i)`, a backward `B(k, i)` (the whole
backward, or only the input gradients when the backward is split) and, when split, a weight
gradient `W(k, i)`. Dependencies: `F(k, i)` after `F(k-1, i)`; `B(k, i)` after `B(k+1, i)`
(the last stage's after its own `F`); `W(k, i)` after `B(k, i)`. A device group runs one op
at a time; which op it runs next is its `Policy`'s choice among the ops it offers. Each op
starts as early as its dependencies and its group allow; ops are committed in order of
their start times, so a policy may choose among the ops ready at a moment (greedy) or follow
a fixed order. Transfers take no time (add them to the op times to model them).

Memory: the engine counts, per stage, the micro-batches whose forward has started and whose
backward has not ended (each keeps the stage's activations), and those whose split
backward has ended and whose weight gradient has not (each keeps the weight stash), and
keeps the most of each at any moment.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

Kind = Literal["forward", "backward", "weight"]
Op = tuple[Kind, int, int]  # (kind, stage, micro-batch)


@dataclass(frozen=True)
class Timed:
    """One op as simulated."""

    kind: Kind
    stage: int
    microbatch: int
    start_s: float
    end_s: float
    device_group: int


@dataclass
class Simulation:
    """What a run of the engine gives: every op's times, the iteration time, the idle share
    of the device groups, and per stage the most micro-batches kept at once."""

    ops: list[Timed] = field(default_factory=list)
    iteration_time_s: float = 0.0
    bubble_fraction: float = 0.0
    max_activations: list[int] = field(default_factory=list)  # per stage
    max_weight_stashes: list[int] = field(default_factory=list)  # per stage


class Policy(Protocol):
    """How one device group picks its next op."""

    def offers(self) -> list[Op]:
        """The ops it may run next, most preferred first (empty: none now)."""
        ...

    def commit(self, op: Op) -> None:
        """The op it runs next (one of `offers()`)."""
        ...

    def done(self) -> bool:
        """Whether it has run every op it has."""
        ...


class FixedOrder:
    """A policy that runs a given list of ops in order."""

    def __init__(self, order: Sequence[Op]) -> None:
        self.order, self.pos = list(order), 0

    def offers(self) -> list[Op]:
        return [self.order[self.pos]] if self.pos < len(self.order) else []

    def commit(self, op: Op) -> None:
        self.pos += 1

    def done(self) -> bool:
        return self.pos >= len(self.order)


def dependencies(op: Op, num_stages: int) -> list[Op]:
    """The ops that must end before `op` starts (see the module docstring)."""
    kind, k, i = op
    if kind == "forward":
        return [("forward", k - 1, i)] if k > 0 else []
    if kind == "backward":
        return [("backward", k + 1, i)] if k < num_stages - 1 else [("forward", k, i)]
    return [("backward", k, i)]


def check_costs(name: str, costs: Sequence[float], num_stages: int) -> None:
    """ValueError unless there is one finite, non-negative cost per stage."""
    if len(costs) != num_stages:
        raise ValueError(f"need one {name} cost per stage ({num_stages}), got {len(costs)}")
    for s, c in enumerate(costs):
        if not math.isfinite(c) or c < 0:
            raise ValueError(f"{name} cost of stage {s} must be finite and >= 0, got {c}")


def _earliest(
    policy: Policy, free: float, end: dict[Op, float], num_stages: int
) -> tuple[float, Op] | None:
    """The op of `policy` that can start first (ties: the one it prefers), or None."""
    if policy.done():
        return None
    best: tuple[float, Op] | None = None
    for op in policy.offers():
        deps = dependencies(op, num_stages)
        if any(d not in end for d in deps):
            continue
        begin = max([free, *(end[d] for d in deps)])
        if best is None or begin < best[0]:
            best = (begin, op)
    return best


def run(
    durations: dict[Kind, Sequence[float]],
    group_of: Sequence[int],
    policies: Sequence[Policy],
) -> Simulation:
    """Simulate until every policy is done; AssertionError if they deadlock."""
    num_stages, num_groups = len(group_of), len(policies)
    end: dict[Op, float] = {}
    free = [0.0] * num_groups
    ops: list[Timed] = []
    activations, stashes = [0] * num_stages, [0] * num_stages
    max_act, max_stash = [0] * num_stages, [0] * num_stages
    # Each group's earliest startable op, recomputed only when something it waits on changed.
    candidate: list[tuple[float, Op] | None] = [None] * num_groups
    dirty = set(range(num_groups))
    while True:
        for g in dirty:
            candidate[g] = _earliest(policies[g], free[g], end, num_stages)
        dirty.clear()
        best_g = -1
        for g in range(num_groups):
            c = candidate[g]
            if c is not None and (best_g < 0 or c[0] < candidate[best_g][0]):  # type: ignore[index]
                best_g = g
        if best_g < 0:
            if any(not p.done() for p in policies):
                raise AssertionError("the schedule's op orders deadlocked")
            break
        g = best_g
        begin, op = candidate[g]  # type: ignore[misc]
        kind, k, i = op
        policies[g].commit(op)
        finish = begin + float(durations[kind][k])
        end[op] = free[g] = finish
        ops.append(Timed(kind, k, i, begin, finish, g))
        dirty.add(g)
        if k > 0:
            dirty.add(group_of[k - 1])
        if k < num_stages - 1:
            dirty.add(group_of[k + 1])
        if kind == "forward":
            activations[k] += 1
            max_act[k] = max(max_act[k], activations[k])
        elif kind == "backward":
            activations[k] -= 1
            if "weight" in durations:
                stashes[k] += 1
                max_stash[k] = max(max_stash[k], stashes[k])
        else:
            stashes[k] -= 1
    iteration = max((t.end_s for t in ops), default=0.0)
    busy = sum(t.end_s - t.start_s for t in ops)
    bubble = 1.0 - busy / (num_groups * iteration) if iteration > 0 else 0.0
    ops.sort(key=lambda t: (t.device_group, t.start_s, t.stage, t.microbatch))
    return Simulation(
        ops=ops,
        iteration_time_s=iteration,
        bubble_fraction=min(1.0, max(0.0, bubble)),
        max_activations=max_act,
        max_weight_stashes=max_stash,
    )
