"""The 1F1B (PipeDream-flush) schedule model: when each micro-batch runs on each stage."""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from schemas import ScheduleEvent

Kind = Literal["forward", "backward"]
Op = tuple[Kind, int]  # (kind, micro-batch)


@dataclass(frozen=True)
class Schedule:
    """Every forward and backward of every micro-batch on every stage, and what they add up to.

    `iteration_time_s`: end of the last event. `bubble_fraction`: idle share of the stages'
    time, `1 - sum(busy) / (stages * iteration_time)`.
    """

    events: list[ScheduleEvent] = field(default_factory=list)
    iteration_time_s: float = 0.0
    bubble_fraction: float = 0.0


def one_f_one_b_order(stage: int, num_stages: int, num_microbatches: int) -> list[Op]:
    """The op order of one stage: `min(S - s - 1, B)` warm-up forwards, then one forward
    and one backward alternately, then the remaining backwards."""
    warmup = min(num_stages - stage - 1, num_microbatches)
    order: list[Op] = [("forward", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order.append(("forward", warmup + i))
        order.append(("backward", i))
    order.extend(("backward", i) for i in range(num_microbatches - warmup, num_microbatches))
    return order


def simulate_1f1b(
    forward_costs: Sequence[float], backward_costs: Sequence[float], num_microbatches: int
) -> Schedule:
    """Simulate one training iteration under 1F1B with per-stage forward/backward times.

    Model: stage `s` runs its ops in the fixed 1F1B order (`one_f_one_b_order`), one at a
    time. Forward of micro-batch `i` on stage `s` starts when stage `s` is free and forward
    `i` on stage `s-1` has ended; backward `i` on stage `s` when stage `s` is free and
    backward `i` on stage `s+1` has ended (the last stage's backward follows its own
    forward). Transfers take no time here (add them to the costs to model them). Each op
    starts as early as those rules allow.
    """
    num_stages = len(forward_costs)
    if num_stages < 1 or len(backward_costs) != num_stages:
        raise ValueError(
            f"need one forward and one backward cost per stage, got {num_stages} and "
            f"{len(backward_costs)}"
        )
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    for name, costs in (("forward", forward_costs), ("backward", backward_costs)):
        for s, c in enumerate(costs):
            if not math.isfinite(c) or c < 0:
                raise ValueError(f"{name} cost of stage {s} must be finite and >= 0, got {c}")
    orders = [one_f_one_b_order(s, num_stages, num_microbatches) for s in range(num_stages)]
    cost = {"forward": forward_costs, "backward": backward_costs}
    end: dict[tuple[Kind, int, int], float] = {}
    start: dict[tuple[Kind, int, int], float] = {}
    pos = [0] * num_stages
    free = [0.0] * num_stages
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(num_stages):
            while pos[s] < len(orders[s]):
                kind, mb = orders[s][pos[s]]
                if kind == "forward":
                    dep = ("forward", s - 1, mb) if s > 0 else None
                else:
                    dep = ("backward", s + 1, mb) if s < num_stages - 1 else ("forward", s, mb)
                if dep is not None and dep not in end:
                    break
                begin = max(free[s], end[dep] if dep is not None else 0.0)
                start[(kind, s, mb)] = begin
                free[s] = end[(kind, s, mb)] = begin + cost[kind][s]
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise AssertionError("1F1B order deadlocked")
    iteration = max(end.values())
    busy = num_microbatches * sum(f + b for f, b in zip(forward_costs, backward_costs, strict=True))
    bubble = 1.0 - busy / (num_stages * iteration) if iteration > 0 else 0.0
    keys = sorted(start, key=lambda k: (k[1], start[k], k[2]))
    events = [
        ScheduleEvent(stage=s, microbatch=mb, kind=kind, start_s=start[(kind, s, mb)], end_s=t)
        for (kind, s, mb), t in ((k, end[k]) for k in keys)
    ]
    return Schedule(
        events=events, iteration_time_s=iteration, bubble_fraction=min(1.0, max(0.0, bubble))
    )
