"""Alpa's recurrence under one bound `t_max` (see `planner.dp`): `_forward` computes its
values, vectorised with numpy; `_Backtrack` recovers a plan from them and breaks ties;
`solve_bound` does both."""

import math

import numpy as np
from numpy.typing import NDArray

from planner.dp_inputs import _Table
from planner.ranks import Stage, _tie_limit


def solve_bound(table: _Table, t_max: float, combine: str = "sum") -> list[Stage] | None:
    """Alpa's recurrence under `t_max`: the least-sum plan (or least-max, `combine="max"`);
    among plans within `REL_TIE` of it, the first in the tie order. None when none exists."""
    return _forward(table, t_max, combine).best_plan()


def _forward(table: _Table, t_max: float, combine: str = "sum") -> "_Backtrack":
    """The recurrence's values under `t_max`, ready to be backtracked.

    Vectorised over stage counts, next-stage starts and device counts; loops over the first
    layer and the submesh. Only values are kept; a plan is recovered by recomputing the few
    states on its path (`_Backtrack`), which is also where ties are broken.
    """
    best, sizes, devices = table.best, table.sizes, table.num_devices
    rows, num_layers = best.shape[0], best.shape[1]
    off = devices  # device axis offset so that `d - devices(m) < 0` reads inf
    width = off + devices + 1
    # f[r]: r stages (row `rows` = every count >= rows); prev[r] feeds target row r + 1:
    # prev[r] = f[r] except prev[rows - 1] = min(f[rows - 1], f[rows]).
    f = np.full((rows + 1, num_layers + 1, width), np.inf)
    f[0, num_layers, off] = 0.0
    prev = np.full((rows, num_layers + 1, width), np.inf)
    prev[0, num_layers, off] = 0.0
    op = np.add if combine == "sum" else np.maximum
    allowed = np.where(best <= t_max, best, np.inf)
    finite: NDArray[np.bool_] = np.isfinite(allowed)
    # Per (first layer, submesh): how many memory rows and which ends have a usable stage.
    row_count = finite.any(axis=2).sum(axis=0)  # [i, m]; rows are nested, so a count
    ends = np.asarray(finite.any(axis=0))  # [i, e, m]
    first_end = ends.argmax(axis=1)
    last_end = num_layers - 1 - ends[:, ::-1, :].argmax(axis=1)
    buf = np.empty((rows, num_layers, devices + 1))
    low = np.empty((rows, devices + 1))
    for i in range(num_layers - 1, -1, -1):
        nr = min(rows, num_layers - i)  # at most L - i stages start at layer i
        top = np.full((nr, devices + 1), np.inf)
        for sub in np.flatnonzero(row_count[i]).tolist():
            n, use = int(sizes[sub]), min(nr, int(row_count[i, sub]))
            e0, e1 = int(first_end[i, sub]), int(last_end[i, sub]) + 1
            cand = buf[:use, : e1 - e0]
            g = allowed[:use, i, e0:e1, sub, None]  # ends e0.. <-> next starts e0 + 1..
            op(prev[:use, e0 + 1 : e1 + 1, off - n : off - n + devices + 1], g, out=cand)
            np.minimum(top[:use], cand.min(axis=1, out=low[:use]), out=top[:use])
        f[1 : nr + 1, i, off:] = top
        prev[: rows - 1, i] = f[: rows - 1, i]
        prev[rows - 1, i] = np.minimum(f[rows - 1, i], f[rows, i])
    return _Backtrack(table, f, prev, allowed, op)


class _Backtrack:
    """The plan of a solved bound, each stage the first in the tie order among the stages that
    keep the objective within `REL_TIE` of the state's optimum.

    A state `(r, i, d)` with `r` below the bucket row has exactly `r` stages left, so its
    choice is by `(end, submesh rank, config rank)`. The bucket row (`r = rows`: `rows` or
    more stages) first prefers the continuation with fewer stages; a stage there continues
    in row `rows - 1` (exactly `rows - 1` more stages) when that is within `REL_TIE` of the
    merged optimum, else in the bucket row, whose stage counts are found on demand.
    """

    def __init__(
        self,
        table: _Table,
        f: NDArray[np.float64],
        prev: NDArray[np.float64],
        allowed: NDArray[np.float64],
        op: np.ufunc,
    ) -> None:
        self.table, self.f, self.prev, self.allowed, self.op = table, f, prev, allowed, op
        self.rows = table.best.shape[0]
        self.num_layers = table.num_layers
        self.sizes = table.sizes
        self.num_subs = int(table.sizes.size)
        self.num_cfgs = int(table.cfg_rank.shape[1])
        self.off = table.num_devices
        self.bucket_counts: dict[tuple[int, int], int] = {}  # (i, d) -> stages from there

    def near(self, r: int, i: int, d: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """The (end, submesh) of the stages within `REL_TIE` of the optimum of `(r, i, d)`."""
        before = self.prev[r - 1][i + 1 :, np.maximum(self.off + d - self.sizes, 0)]  # [L-i, S]
        values = self.op(before, self.allowed[r - 1, i, i:, :])
        limit = _tie_limit(float(self.f[r, i, self.off + d]))
        e, m = np.nonzero(np.isfinite(values) & (values <= limit))
        if e.size == 0:
            raise AssertionError(f"DP backtrack lost the optimum at layer {i}")
        return e + i, m

    def in_bucket(self, k: int, d: int) -> bool:
        """Whether a bucket-row stage followed by layer `k` with `d` devices left continues in
        the bucket row: only when row `rows - 1` is not within `REL_TIE` of the optimum."""
        if k >= self.num_layers:
            return False
        a = float(self.f[self.rows - 1, k, self.off + d])
        b = float(self.f[self.rows, k, self.off + d])
        return math.isfinite(b) and not a <= _tie_limit(min(a, b))

    def stages_after(self, k: int, d: int) -> int:
        """Stages after a bucket-row stage followed by layer `k` with `d` devices left."""
        if not self.in_bucket(k, d):
            return self.rows - 1
        todo = [(k, d)]
        while todo:  # depth first over the bucket states below, without recursion
            state = todo[-1]
            if state in self.bucket_counts:
                todo.pop()
                continue
            e, m = self.near(self.rows, *state)
            after = zip((e + 1).tolist(), (state[1] - self.sizes[m]).tolist(), strict=True)
            pending = [s for s in after if self.in_bucket(*s) and s not in self.bucket_counts]
            if pending:
                todo.extend(pending)
                continue
            end, sub = self.choose(self.rows, *state)
            left = self.stages_after(end + 1, state[1] - int(self.sizes[sub]))  # known now
            self.bucket_counts[state] = 1 + left
            todo.pop()
        return self.bucket_counts[(k, d)]

    def choose(self, r: int, i: int, d: int) -> tuple[int, int]:
        """The stage `(end, submesh)` taken from state `(r, i, d)`: the first of the near ones
        by (stages after it, end, submesh rank, config rank)."""
        e, m = self.near(r, i, d)
        if e.size > 1:
            configs = self.table.cfg_rank[m, self.table.arg[r - 1, i, e, m]]
            key = (e * self.num_subs + self.table.sub_rank[m]) * self.num_cfgs + configs
            if r == self.rows:
                ends, left = (e + 1).tolist(), (d - self.sizes[m]).tolist()
                after = [self.stages_after(k, x) for k, x in zip(ends, left, strict=True)]
                key = np.array(after) * (self.num_layers * self.num_subs * self.num_cfgs) + key
            j = int(key.argmin())
            e, m = e[j : j + 1], m[j : j + 1]
        return int(e[0]), int(m[0])

    def best_plan(self) -> list[Stage] | None:
        """The optimum's plan, or None. Fewer stages first: the least row tied with the best
        (the bucket row `rows` has the most stages)."""
        final = self.f[1:, 0, self.off + self.table.num_devices]
        if not np.isfinite(final).any():
            return None
        r = int(np.flatnonzero(final <= _tie_limit(float(final.min())))[0]) + 1
        return self.path(r)

    def successor_row(self, r: int, k: int, d: int) -> int:
        """The row a stage taken from row `r` continues in, followed by layer `k` with `d`
        devices left (as the recurrence merged it)."""
        return self.rows if r == self.rows and self.in_bucket(k, d) else r - 1

    def path(self, r: int, i: int = 0, d: int | None = None) -> list[Stage]:
        """The stages from state `(r, i, d)` (default: the start, all devices left)."""
        d = self.table.num_devices if d is None else d
        stages: list[Stage] = []
        while i < self.num_layers:
            e, m = self.choose(r, i, d)
            stages.append((i, e, m, int(self.table.arg[r - 1, i, e, m])))
            d -= int(self.sizes[m])
            i = e + 1
            r = self.successor_row(r, i, d)  # the bucket row ">= rows stages" may feed itself
        if r != 0 or d != 0:
            raise AssertionError(f"DP backtrack ended at row {r} with {d} devices left")
        return stages
