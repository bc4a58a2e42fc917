"""The backward's split into B and W, estimated where it was not measured.

With `schedule: auto` a job measures its layer profiles without the split (three modules,
not five); the zero-bubble schedule then plans on estimated splits, and a stage is measured
split only when a zero-bubble plan that could be best rests on it (`planner.verify`).

A stage's B is `ρ_B x` its backward, its W `ρ_W x` its backward and its weight stash
`σ x` its activation stash, with `ρ_B`, `ρ_W`, `σ` the medians over the stages measured
split so far (each distinct stage once); before any is, `PRIOR`: B and W halves of the
backward, and a weight stash half the activations (the measured ones ran 0.3-0.8 of it).
"""

import dataclasses
import statistics
from collections.abc import Iterable

import numpy as np

from planner.table import CostTable, Key
from schemas import ModuleKind, StageProfileResult


@dataclasses.dataclass(frozen=True)
class SplitRatios:
    """B / backward, W / backward and weight stash / activation stash."""

    input_grad: float
    weight_grad: float
    stash: float


PRIOR = SplitRatios(input_grad=0.5, weight_grad=0.5, stash=0.5)


def is_split(result: StageProfileResult) -> bool:
    """Whether the result holds the split backward (B and W measured)."""
    return result.module(ModuleKind.backward_input) is not None


def split_ratios(results: Iterable[StageProfileResult]) -> SplitRatios:
    """The median ratios over the ok results measured split (`PRIOR` when none)."""
    seen: dict[str, StageProfileResult] = {}
    for r in results:
        if r.ok and is_split(r) and r.backward_cost > 0:
            seen.setdefault(r.fingerprint, r)
    if not seen:
        return PRIOR
    split = list(seen.values())
    stashes = [r.weight_stash_size / r.intermediate_size for r in split if r.intermediate_size]
    return SplitRatios(
        input_grad=statistics.median(r.input_grad_cost / r.backward_cost for r in split),
        weight_grad=statistics.median(r.weight_grad_cost / r.backward_cost for r in split),
        stash=statistics.median(stashes) if stashes else PRIOR.stash,
    )


def with_split_estimates(table: CostTable, keys: Iterable[Key], ratios: SplitRatios) -> CostTable:
    """`table` with B, W and the weight stash of `keys` estimated from their backward and
    activation stash (keys without a finite backward are left as they are)."""
    mask = np.zeros(table.backward.shape, dtype=bool)
    for key in keys:
        mask[key] = True
    mask &= np.isfinite(table.backward)
    return dataclasses.replace(
        table,
        input_grad=np.where(mask, ratios.input_grad * table.backward, table.input_grad),
        weight_grad=np.where(mask, ratios.weight_grad * table.backward, table.weight_grad),
        weight_stash=np.where(mask, ratios.stash * table.intermediate, table.weight_stash),
    )
