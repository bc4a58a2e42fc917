"""Which unmeasured stage candidates can still change the optimal plan.

Alpa's objective `Σ t + (B-1)·max t` is at least `B·t_s` for every stage `s` of a plan. A
stage that runs layers i..j on a submesh and config takes at least as long as one that runs
a sub-range of them on the same submesh and config, so the largest measured time of a
sub-range bounds it from below. Once some measured plan costs `UB`, a candidate with
`B · bound > (1 + margin) · UB` cannot be in a better plan: it need not be measured. The
bound only grows and `UB` only falls as results arrive, so a skipped candidate stays skipped.
"""

from collections.abc import Iterable, Mapping

import numpy as np
from numpy.typing import NDArray

from planner.candidates import CandidateSpace
from planner.dp import training_dp
from planner.table import Key, build_cost_table
from schemas import ClusterSpec, ModelSpec, PlanOptions, StageProfileResult


def range_lower_bounds(measured: NDArray[np.float64]) -> NDArray[np.float64]:
    """`[L, L, S, C]` lower bounds: the largest measured time of any sub-range.

    `measured` holds measured stage times, 0 where nothing is known (unmeasured, failed).
    `bound[i, j] = max(measured[i, j], bound[i + 1, j], bound[i, j - 1])`.
    """
    bound = np.array(measured, dtype=np.float64, copy=True)
    num_layers = bound.shape[0]
    for length in range(1, num_layers):
        starts = np.arange(num_layers - length)
        ends = starts + length
        bound[starts, ends] = np.maximum(
            bound[starts, ends], np.maximum(bound[starts + 1, ends], bound[starts, ends - 1])
        )
    return bound


class StagePruner:
    """Tracks results as they arrive and says which candidates are not worth measuring."""

    def __init__(
        self,
        spec: ModelSpec,
        cluster: ClusterSpec,
        options: PlanOptions,
        space: CandidateSpace,
        margin: float = 0.1,
        keep: Iterable[Key] = (),
    ) -> None:
        """`keep`: keys always worth measuring (e.g. the baselines' stages)."""
        self._spec, self._cluster, self._options, self._space = spec, cluster, options, space
        self._margin = margin
        self._keep = frozenset(keep)
        self._results: dict[Key, StageProfileResult] = {}
        self._dirty = True
        self._upper = np.inf
        self._bounds: NDArray[np.float64] | None = None

    def add(self, keys: Iterable[Key], result: StageProfileResult) -> None:
        """Record `result` for every candidate key that shares its fingerprint."""
        for key in keys:
            self._results[key] = result
        self._dirty = True

    def _refresh(self) -> None:
        if not self._dirty:
            return
        table = build_cost_table(
            self._spec,
            self._cluster,
            self._space,
            self._results,
            self._options.include_communication,
        )
        dp = training_dp(
            table.dp_cost,
            table.max_n_succ_stages,
            [s.as_tuple() for s in self._space.submeshes],
            self._cluster.num_devices,
            self._options.num_microbatches,
        )
        self._upper = dp.cost
        known = np.where(np.isfinite(table.compute_cost), table.compute_cost, 0.0)
        comm = (table.comm_forward + table.comm_backward)[..., None]
        self._bounds = range_lower_bounds(known) + comm
        self._dirty = False

    @property
    def upper_bound(self) -> float:
        """Cost of the best plan among the results so far (inf until one exists)."""
        self._refresh()
        return float(self._upper)

    def prunable(self, keys: Iterable[Key]) -> bool:
        """True when the stage these keys share cannot be in a plan better than the best one."""
        keys = list(keys)
        if any(key in self._keep for key in keys):
            return False
        self._refresh()
        if not np.isfinite(self._upper) or self._bounds is None:
            return False
        threshold = (1.0 + self._margin) * self._upper / self._options.num_microbatches
        return any(self._bounds[key] > threshold for key in keys)

    @property
    def results(self) -> Mapping[Key, StageProfileResult]:
        return self._results
