"""MaxText's choice, offered to the unrestricted search: the layers before and after the
repeated blocks (embedding, head) run on every device outside the pipeline, data parallel,
once per micro-batch, and the pipeline holds the blocks only.

A plan's outside time is measured, never scaled: each outside layer's one-layer stage on a
submesh of every device (`with_layers_outside` adds those candidates to a job's space; Alpa's
space holds only the whole model there; the estimate search ranks them at their scaled
estimate and measures those a plan within its band holds, as for the whole model), the fastest
config that keeps all B micro-batches' stash (everything runs before and after the
pipeline: `max_n_succ_stages >= B - 1`), forward + backward times B. Their memory is not
added to the pipeline stages' on the same devices (as in the MaxText search,
`planner.trainers`). A plan with layers outside is `Proposal.outside` non-empty; its
simulated time is the pipeline's plus theirs.
"""

import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from planner.candidates import CandidateSpace
from planner.search import ScheduleSearch, search_schedule
from planner.table import CostTable, Key
from planner.trainers import block_run
from schemas import ModelSpec, StageKey, StageProfileResult

G = TypeVar("G", bound=np.generic)


@dataclass(frozen=True)
class OutsideChoice:
    """The pipelined layers `first..last` and the one-layer stages of the others."""

    first: int
    last: int
    keys: tuple[Key, ...]
    seconds: float  # per iteration: Σ (forward + backward) × B


def _outside_layers(spec: ModelSpec) -> tuple[int, int, list[int]] | None:
    run = block_run(spec)
    if run is None:
        return None
    first, last = run
    outside = [i for i in range(spec.num_layers) if not first <= i <= last]
    return (first, last, outside) if outside else None


def _whole(space: CandidateSpace, num_devices: int) -> list[int]:
    return [m for m, s in enumerate(space.submeshes) if s.num_devices == num_devices]


def with_layers_outside(space: CandidateSpace, spec: ModelSpec, num_devices: int) -> CandidateSpace:
    """`space` with the one-layer stages, on every submesh of all devices and each of its
    configs, of the layers before and after the repeated blocks (none when the model has no
    repeated blocks, or the blocks are the whole model)."""
    found = _outside_layers(spec)
    if found is None:
        return space
    have = {k.as_tuple() for k in space.keys}
    keys = list(space.keys)
    for m in _whole(space, num_devices):
        for c in range(len(space.configs[m])):
            for i in found[2]:
                if (i, i, m, c) not in have:
                    keys.append(StageKey(start=i, end=i, submesh_id=m, config_id=c))
    if len(keys) == len(space.keys):
        return space
    return CandidateSpace(space.submeshes, space.configs, keys)


def outside_choice(
    spec: ModelSpec, space: CandidateSpace, table: CostTable, num_devices: int, micro: int
) -> OutsideChoice | None:
    """The outside layers at their fastest measured one-layer stage on every device that
    holds all B micro-batches; None when a layer has none (or the model no outside layers)."""
    found = _outside_layers(spec)
    if found is None:
        return None
    first, last, outside = found
    whole = _whole(space, num_devices)
    keys: list[Key] = []
    total = 0.0
    for i in outside:
        best: tuple[float, Key] | None = None
        for m in whole:
            for c in range(len(space.configs[m])):
                key = (i, i, m, c)
                t = float(table.forward[key] + table.backward[key])
                fits = int(table.max_n_succ_stages[key]) >= micro - 1
                if math.isfinite(t) and fits and (best is None or t < best[0]):
                    best = (t, key)
        if best is None:
            return None
        total += best[0] * micro
        keys.append(best[1])
    return OutsideChoice(first, last, tuple(keys), total)


def pipeline_table(table: CostTable, first: int, last: int) -> CostTable:
    """The table of layers `first..last` only, renumbered from 0."""
    span = slice(first, last + 1)

    def cut(arr: NDArray[G]) -> NDArray[G]:
        return arr[span, span]

    def inside(key: Key) -> bool:
        return first <= key[0] and key[1] <= last

    def moved(key: Key) -> Key:
        return (key[0] - first, key[1] - first, key[2], key[3])

    return dataclasses.replace(
        table,
        forward=cut(table.forward),
        backward=cut(table.backward),
        comm_forward=cut(table.comm_forward),
        comm_backward=cut(table.comm_backward),
        max_n_succ_stages=cut(table.max_n_succ_stages),
        results=_Shifted(table.results, first, last),
        statuses={moved(k): s for k, s in table.statuses.items() if inside(k)},
        input_grad=cut(table.input_grad),
        weight_grad=cut(table.weight_grad),
        free_bytes=cut(table.free_bytes),
        intermediate=cut(table.intermediate),
        weight_stash=cut(table.weight_stash),
        fixed_bytes=cut(table.fixed_bytes),
        available=cut(table.available),
    )


class _Shifted(Mapping[Key, StageProfileResult]):
    """The results of layers `first..last`, keyed from 0, read when asked for (an estimated
    table makes its results lazily)."""

    def __init__(self, results: Mapping[Key, StageProfileResult], first: int, last: int):
        self._results, self._first, self._last = results, first, last

    def __getitem__(self, key: Key) -> StageProfileResult:
        a, b, m, c = key
        if not 0 <= a <= b <= self._last - self._first:
            raise KeyError(key)
        return self._results[(a + self._first, b + self._first, m, c)]

    def __iter__(self) -> Iterator[Key]:
        for a, b, m, c in self._results:
            if self._first <= a and b <= self._last:
                yield (a - self._first, b - self._first, m, c)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def search_with_outside(
    name: str,
    spec: ModelSpec,
    table: CostTable,
    space: CandidateSpace,
    num_devices: int,
    micro: int,
    config_rank: NDArray[np.int64],
    virtual_stages: int | None = None,
    outside: bool = True,
) -> ScheduleSearch:
    """The schedule's search (`planner.search.search_schedule`) over the whole model and,
    when `outside` and the table has what it needs, over the blocks with the other layers
    outside the pipeline; both plans' proposals ranked together by simulated time (ties:
    the whole-model plan first)."""
    search = search_schedule(name, table, space, num_devices, micro, config_rank, virtual_stages)
    choice = outside_choice(spec, space, table, num_devices, micro) if outside else None
    if choice is None:
        return search
    sub = pipeline_table(table, choice.first, choice.last)
    inner = search_schedule(name, sub, space, num_devices, micro, config_rank, virtual_stages)
    shifted = [
        dataclasses.replace(
            p,
            keys=[(a + choice.first, b + choice.first, m, c) for a, b, m, c in p.keys],
            outside=choice.keys,
            outside_s=choice.seconds,
        )
        for p in inner.ranked
    ]
    ranked = sorted(search.ranked + shifted, key=lambda p: float(f"{p.time:.12g}"))
    return ScheduleSearch(
        name=name,
        ranked=ranked,
        reason=None if ranked else search.reason,
        seconds=search.seconds + inner.seconds,
    )
