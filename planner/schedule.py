"""The schedule models: GPipe, 1F1B, interleaved 1F1B and ZB-H1, each a policy per device
group on the shared engine (`planner.engine`), and what a simulation adds up to."""

from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.engine import FixedOrder, Kind, Op, Simulation, Timed, check_costs, run
from schemas import ScheduleEvent

SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1")


@dataclass(frozen=True)
class Schedule:
    """Every op of every micro-batch on every stage, and what they add up to.

    `iteration_time_s`: end of the last event. `bubble_fraction`: idle share of the device
    groups' time, `1 - sum(busy) / (groups * iteration_time)`. `max_activations[s]`: the most
    micro-batches stage `s` keeps activations of at once; `max_weight_stashes[s]`: the most
    weight stashes (split backward) it keeps at once. `events`: the ops as `ScheduleEvent`s.
    """

    ops: list[Timed] = field(default_factory=list)
    iteration_time_s: float = 0.0
    bubble_fraction: float = 0.0
    max_activations: list[int] = field(default_factory=list)
    max_weight_stashes: list[int] = field(default_factory=list)

    @property
    def events(self) -> list[ScheduleEvent]:
        return [
            ScheduleEvent(
                stage=t.stage,
                microbatch=t.microbatch,
                kind=t.kind,
                start_s=t.start_s,
                end_s=t.end_s,
                device_group=t.device_group,
            )
            for t in self.ops
        ]


def _schedule(sim: Simulation) -> Schedule:
    return Schedule(
        ops=sim.ops,
        iteration_time_s=sim.iteration_time_s,
        bubble_fraction=sim.bubble_fraction,
        max_activations=sim.max_activations,
        max_weight_stashes=sim.max_weight_stashes,
    )


def _check(forward: Sequence[float], backward: Sequence[float], num_microbatches: int) -> int:
    num_stages = len(forward)
    if num_stages < 1:
        raise ValueError("need at least one stage")
    check_costs("forward", forward, num_stages)
    check_costs("backward", backward, num_stages)
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    return num_stages


def one_f_one_b_order(stage: int, num_stages: int, num_microbatches: int) -> list[tuple[Kind, int]]:
    """The op order of one stage: `min(S - s - 1, B)` warm-up forwards, then one forward
    and one backward alternately, then the remaining backwards."""
    warmup = min(num_stages - stage - 1, num_microbatches)
    order: list[tuple[Kind, int]] = [("forward", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order.append(("forward", warmup + i))
        order.append(("backward", i))
    order.extend(("backward", i) for i in range(num_microbatches - warmup, num_microbatches))
    return order


def gpipe_order(num_microbatches: int) -> list[tuple[Kind, int]]:
    """Every forward, then every backward, in micro-batch order."""
    kinds: tuple[Kind, Kind] = ("forward", "backward")
    return [(kind, i) for kind in kinds for i in range(num_microbatches)]


def _fixed(orders: list[list[Op]]) -> list[FixedOrder]:
    return [FixedOrder(o) for o in orders]


def simulate_1f1b(
    forward_costs: Sequence[float], backward_costs: Sequence[float], num_microbatches: int
) -> Schedule:
    """One training iteration under 1F1B (PipeDream-flush): stage `s` keeps at most `S - s`
    micro-batches in flight (`one_f_one_b_order`)."""
    p = _check(forward_costs, backward_costs, num_microbatches)
    orders = [
        [(kind, s, i) for kind, i in one_f_one_b_order(s, p, num_microbatches)] for s in range(p)
    ]
    durations: dict[Kind, Sequence[float]] = {"forward": forward_costs, "backward": backward_costs}
    return _schedule(run(durations, list(range(p)), _fixed(orders)))


def simulate_gpipe(
    forward_costs: Sequence[float], backward_costs: Sequence[float], num_microbatches: int
) -> Schedule:
    """One training iteration under GPipe: all forwards, then all backwards; every stage
    keeps all micro-batches in flight."""
    p = _check(forward_costs, backward_costs, num_microbatches)
    orders = [[(kind, s, i) for kind, i in gpipe_order(num_microbatches)] for s in range(p)]
    durations: dict[Kind, Sequence[float]] = {"forward": forward_costs, "backward": backward_costs}
    return _schedule(run(durations, list(range(p)), _fixed(orders)))


def interleaved_order(
    group: int, num_groups: int, num_chunks: int, num_microbatches: int
) -> list[Op]:
    """Megatron's interleaved 1F1B order of one device group (chunk `c` of group `g` is
    stage `c * p + g`): micro-batches in rounds of `p` per chunk, forwards chunk 0 first and
    backwards last chunk first; `2 (p - g - 1) + (v - 1) p` warm-up forwards, then one
    forward and one backward alternately, then the remaining backwards."""
    p, v, m = num_groups, num_chunks, num_microbatches
    total = m * v

    def op(kind: Kind, k: int) -> Op:
        chunk = (k % (p * v)) // p
        if kind == "backward":
            chunk = v - 1 - chunk
        return (kind, chunk * p + group, (k // (p * v)) * p + k % p)

    warmup = min(2 * (p - group - 1) + (v - 1) * p, total)
    order = [op("forward", k) for k in range(warmup)]
    for k in range(total - warmup):
        order.append(op("forward", warmup + k))
        order.append(op("backward", k))
    order.extend(op("backward", k) for k in range(total - warmup, total))
    return order


def simulate_interleaved(
    forward_costs: Sequence[float],
    backward_costs: Sequence[float],
    num_microbatches: int,
    num_groups: int,
) -> Schedule:
    """One iteration under interleaved 1F1B: `len(forward_costs) = p * v` chunks on
    `num_groups = p` device groups, chunk `k` on group `k mod p`. Needs the micro-batches to
    be a multiple of `p` (Megatron's rule); ValueError otherwise."""
    num_stages = _check(forward_costs, backward_costs, num_microbatches)
    p = num_groups
    if p < 1 or num_stages % p:
        raise ValueError(f"{num_stages} chunks do not split evenly over {p} device groups")
    if num_microbatches % p:
        raise ValueError(
            f"interleaved needs num_microbatches ({num_microbatches}) to be a multiple of the "
            f"device groups ({p})"
        )
    v = num_stages // p
    orders = [interleaved_order(g, p, v, num_microbatches) for g in range(p)]
    durations: dict[Kind, Sequence[float]] = {"forward": forward_costs, "backward": backward_costs}
    return _schedule(run(durations, [k % p for k in range(num_stages)], _fixed(orders)))


def zb_h1_order(stage: int, num_stages: int, num_microbatches: int) -> list[Op]:
    """ZB-H1's op order on stage `s` of `p` (Qi et al., "Zero Bubble Pipeline Parallelism",
    ICLR'24, the handcrafted ZB-H1): 1F1B's warm-up of `p - s` forwards, then for each
    micro-batch its input-gradient backward (B), the weight gradient (W) of the micro-batch
    `s` before it (stage `s` defers `s` of them into the cool-down bubble) and the next
    forward; the deferred Ws last. Activations are 1F1B's (`p - s`), and at most `p`
    micro-batches are between their forward and their W on any stage, as on 1F1B's first."""
    s, m = stage, num_microbatches
    warm_up = min(num_stages - s, m)
    order: list[Op] = [("forward", s, i) for i in range(warm_up)]
    next_f, next_w = warm_up, 0
    for j in range(m):
        order.append(("backward", s, j))
        if j >= s:
            order.append(("weight", s, next_w))
            next_w += 1
        if next_f < m:
            order.append(("forward", s, next_f))
            next_f += 1
    order += [("weight", s, w) for w in range(next_w, m)]
    return order


def simulate_zb_h1(
    forward_costs: Sequence[float],
    input_grad_costs: Sequence[float],
    weight_grad_costs: Sequence[float],
    num_microbatches: int,
) -> Schedule:
    """One iteration under ZB-H1 (zero bubble, same activation memory as 1F1B): the
    backward split into B (input gradients, on the critical path) and W (weight gradients),
    W filling the bubbles (`zb_h1_order`). Events of kind `backward` are B, `weight` W."""
    p = _check(forward_costs, input_grad_costs, num_microbatches)
    check_costs("weight", weight_grad_costs, p)
    policies = [FixedOrder(zb_h1_order(s, p, num_microbatches)) for s in range(p)]
    durations: dict[Kind, Sequence[float]] = {
        "forward": forward_costs,
        "backward": input_grad_costs,
        "weight": weight_grad_costs,
    }
    return _schedule(run(durations, list(range(p)), policies))


def interleaved_in_flight(num_groups: int, num_chunks: int, num_microbatches: int) -> list[int]:
    """Per chunk (stage `c * p + g`), the most micro-batches it keeps at once under
    `interleaved_order` (fixed by the order alone: a device group runs its ops one by one)."""
    p, v = num_groups, num_chunks
    out = [0] * (p * v)
    for g in range(p):
        count = [0] * (p * v)
        for kind, k, _ in interleaved_order(g, p, v, num_microbatches):
            count[k] += 1 if kind == "forward" else -1
            out[k] = max(out[k], count[k])
    return out


def simulate(
    name: str,
    forward: Sequence[float],
    backward: Sequence[float],
    num_microbatches: int,
    weight: Sequence[float] | None = None,
    num_groups: int | None = None,
) -> Schedule:
    """Simulate a schedule by name; `backward` is B and `weight` W for zb-h1, and
    `num_groups` the device groups of interleaved (default: one per stage)."""
    if name == "1f1b":
        return simulate_1f1b(forward, backward, num_microbatches)
    if name == "gpipe":
        return simulate_gpipe(forward, backward, num_microbatches)
    if name == "interleaved":
        groups = len(forward) if num_groups is None else num_groups
        return simulate_interleaved(forward, backward, num_microbatches, groups)
    if name == "zb-h1":
        if weight is None:
            raise ValueError("zb-h1 needs the weight-gradient (W) time of every stage")
        return simulate_zb_h1(forward, backward, weight, num_microbatches)
    raise ValueError(f"unknown schedule {name!r}; use one of {SCHEDULES}")
