"""Alpa's stage DP (`training_dp`, `inference_dp`), exact and vectorised with numpy.

Inputs are Alpa's: `compute_cost[start, end, submesh, config]` (shape `[L, L, S, C]`, `end`
inclusive, seconds, `inf` = infeasible or not measured) and `max_n_succ_stages` of the same
shape (how many stages may follow a stage before its stashed activations overflow memory).

Alpa's recurrence, for a bound `t_max` on any stage's cost:
`f[s, i, d]` = least summed cost of covering layers `i..L-1` with `s` stages on exactly `d`
devices, each stage `(i, k-1, m, c)` with `cost <= t_max` and `s - 1 <= max_n_succ_stages`::

    f[s, i, d] = min_{k > i, m, c} f[s-1, k, d - devices(m)] + cost[i, k-1, m, c]

and the plan's objective is `sum + (B - 1) * max` over its stages. Alpa solves the
recurrence for every distinct `t_max` in increasing order and stops once `B * t_max` reaches
the best objective found. Here the recurrence is vectorised over stage counts, next-stage
starts and device counts (configs are reduced up front: for a fixed memory row the cheapest
feasible config is the only one that matters), and the bounds are walked from the top down
(`_BoundSearch`): solving at `t` gives a plan whose largest stage `M <= t` has the least sum
for every bound in `[M, t]`, so the next bound is the largest one below `M`, and only while
`least sum + (B - 1) * bound` (or Alpa's `B * t_max`) is below the best objective; nothing
lies below the least largest stage of any plan (one max-plus solve of the same recurrence).
This solves a handful of bounds where Alpa solves hundreds, and it is exact: it returns the
optimum of enumerating every split and every (submesh, config) that uses all devices
within the memory rule. Alpa's 1e-6 gap between bounds is not needed (and would cost
exactness).

Ties. Plans whose objectives agree within a relative `REL_TIE` (1e-12, which absorbs the
rounding of sums taken in different orders) are tied, and the DP returns the first of them
in this total order (`plan_order_key`), which depends only on what the stages are, never on
the order in which submeshes or configs were given:

1. fewer stages first;
2. then the stage sequences compared lexicographically, first stage first, each stage by
   `(start, end, submesh rank, config rank)`. The submesh rank orders submeshes by their shape
   `(hosts, devices_per_host)` (equal shapes: by index); the config rank is the caller's
   `config_rank[submesh, config]` (default: the config index), e.g. by logical mesh and
   strategy, as `planner.plan.config_ranks` does.

Inside a bound the values are as before; the backtrack (`_Backtrack`) takes at each state
the first near-optimal stage in this order (a state below the bucket row has a fixed number
of stages left, so only the bucket row needs stage counts, found on demand), which gives
the first least-sum plan in the order; configs of equal cost are reduced to the lowest
rank. The bound walk keeps every plan it solved, also visits the bounds that may hold a
tied plan, and returns the first of the tied ones. Costs: the same solves as before plus a
few small ones on the plan's path.

Runner-up (`runner_up_dp`): the best plan other than the chosen one, in the same order.
Any other plan leaves the chosen plan's path through the recurrence's states at a first
point: another first row (stage count), another (end, submesh) or config at a state, or in
the bucket row the other successor row; from there it is best continued optimally. So each
bound needs one solve and a look at the chosen plan's states (`solve_bound_other`), and
the same bound walk finds the runner-up in about the time of the DP itself. (Equivalently,
and checked against it in the tests: the best over the chosen stages of the DP without
that stage, `planner.reference.runner_up_by_exclusion`, one whole DP per stage.)
"""

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from schemas import SubmeshShape

logger = logging.getLogger(__name__)

Stage = tuple[int, int, int, int]
OrderKey = tuple[int, tuple[tuple[int, int, int, int], ...]]
MAX_TABLE_BYTES = 2 * 2**30  # working arrays of one DP; beyond it, refuse instead of swapping
REL_TIE = 1e-12  # objectives within this relative distance are tied
SubmeshLike = tuple[int, int] | SubmeshShape


@dataclass(frozen=True)
class DPResult:
    """A DP answer: `cost` (inf when no plan exists) and `stages` as
    `(start, end_inclusive, submesh_id, config_id)`, first stage first."""

    cost: float
    stages: list[Stage] = field(default_factory=list)
    num_bounds_solved: int = 0
    table: "_Table | None" = field(default=None, repr=False, compare=False)  # the reduced table

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.cost)


@dataclass(frozen=True)
class _Table:
    """Validated inputs, reduced over configs.

    `best[q, i, e, m]`: least cost of layers `i..e` on submesh `m` over the configs allowed
    when `q` stages follow (the last row `Q-1` stands for every `q >= Q-1`); `arg` its config
    (among equal costs, the one of lowest config rank). `level[i, e, m, c]`: the highest row
    at which a config is allowed (-1: never). `sub_rank[m]`, `cfg_rank[m, c]`: the tie order.
    """

    cost: NDArray[np.float64]
    best: NDArray[np.float64]
    arg: NDArray[np.int16]
    sizes: NDArray[np.int64]
    num_devices: int
    level: NDArray[np.int64]
    sub_rank: NDArray[np.int64]
    cfg_rank: NDArray[np.int64]

    @property
    def num_layers(self) -> int:
        return int(self.cost.shape[0])

    def order_key(self, stages: Sequence[Stage]) -> OrderKey:
        """The plan's place in the tie order (see the module docstring)."""
        return plan_order_key(stages, self.sub_rank, self.cfg_rank)


def plan_order_key(stages: Sequence[Stage], sub_rank: ArrayLike, cfg_rank: ArrayLike) -> OrderKey:
    """`(number of stages, ((start, end, submesh rank, config rank), ...))`: among tied plans
    the DP returns the one with the smallest key."""
    subs, cfgs = np.asarray(sub_rank), np.asarray(cfg_rank)
    return (
        len(stages),
        tuple((a, b, int(subs[m]), int(cfgs[m, c])) for a, b, m, c in stages),
    )


def _tie_limit(value: float) -> float:
    """The largest objective still tied with `value`."""
    return value + REL_TIE * abs(value)


def _where(mask: NDArray[np.bool_]) -> str:
    idx = tuple(int(x) for x in np.argwhere(mask)[0])
    return f"[start, end, submesh, config] = {idx} ({int(mask.sum())} entries)"


def _submesh_shapes(submesh_choices: Sequence[SubmeshLike]) -> list[tuple[int, int]]:
    shapes = []
    for s in submesh_choices:
        hosts, devices = s.as_tuple() if isinstance(s, SubmeshShape) else s
        if hosts < 1 or devices < 1:
            raise ValueError(f"submesh {s} must have positive sizes")
        shapes.append((int(hosts), int(devices)))
    return shapes


def _submesh_sizes(submesh_choices: Sequence[SubmeshLike]) -> NDArray[np.int64]:
    return np.array([h * d for h, d in _submesh_shapes(submesh_choices)], dtype=np.int64)


def submesh_ranks(submesh_choices: Sequence[SubmeshLike]) -> NDArray[np.int64]:
    """Each submesh's rank in the tie order: by shape `(hosts, devices_per_host)`, then index."""
    shapes = _submesh_shapes(submesh_choices)
    order = sorted(range(len(shapes)), key=lambda m: (shapes[m], m))
    ranks = np.empty(len(shapes), dtype=np.int64)
    ranks[order] = np.arange(len(shapes))
    return ranks


def _config_ranks(config_rank: ArrayLike | None, shape: tuple[int, int]) -> NDArray[np.int64]:
    """Dense ranks `0..C-1` per submesh from any sortable numbers (equal ones: by index)."""
    if config_rank is None:
        return np.broadcast_to(np.arange(shape[1], dtype=np.int64), shape).copy()
    raw = np.asarray(config_rank)
    if raw.shape != shape:
        raise ValueError(f"config_rank has shape {raw.shape}, expected [S, C] = {shape}")
    if raw.dtype.kind == "f" and np.isnan(raw).any():
        raise ValueError("config_rank is NaN")
    order = np.argsort(raw, axis=1, kind="stable")
    ranks = np.empty(shape, dtype=np.int64)
    np.put_along_axis(ranks, order, np.arange(shape[1])[None, :], axis=1)
    return ranks


def validate_inputs(
    compute_cost: ArrayLike,
    max_n_succ_stages: ArrayLike | None,
    submesh_choices: Sequence[SubmeshLike],
    num_devices: int,
) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]:
    """Check shapes and values; NaN and negative costs are refused with a ValueError.

    Returns float64 costs (entries with start > end set to inf), integer max_n_succ_stages
    (None means unlimited; non-finite or NaN-free floats are floored; -inf gives -1) and the
    device count of each submesh.
    """
    cost = np.array(compute_cost, dtype=np.float64)
    if cost.ndim != 4 or cost.shape[0] != cost.shape[1] or cost.shape[0] < 1:
        raise ValueError(f"compute_cost must have shape [L, L, S, C] with L >= 1, got {cost.shape}")
    sizes = _submesh_sizes(submesh_choices)
    if cost.shape[2] != len(sizes):
        raise ValueError(
            f"compute_cost has {cost.shape[2]} submeshes but {len(sizes)} submesh choices"
        )
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    nan = np.isnan(cost)
    if nan.any():
        raise ValueError(f"compute_cost is NaN at {_where(nan)}")
    if (cost < 0).any():
        raise ValueError(f"compute_cost is negative at {_where(cost < 0)}")
    if max_n_succ_stages is None:
        mns = np.full(cost.shape, np.iinfo(np.int64).max, dtype=np.int64)
    else:
        raw = np.asarray(max_n_succ_stages)
        if raw.shape != cost.shape:
            raise ValueError(
                f"max_n_succ_stages has shape {raw.shape}, compute_cost has {cost.shape}"
            )
        if raw.dtype.kind == "f":
            if np.isnan(raw).any():
                raise ValueError(f"max_n_succ_stages is NaN at {_where(np.isnan(raw))}")
            big = float(np.iinfo(np.int64).max // 2)
            mns = np.floor(np.clip(raw, -1.0, big)).astype(np.int64)
        elif raw.dtype.kind in "iub":
            mns = raw.astype(np.int64)
        else:
            raise ValueError(f"max_n_succ_stages must be numeric, got dtype {raw.dtype}")
    num_layers = cost.shape[0]
    lower = np.tril(np.ones((num_layers, num_layers), dtype=bool), k=-1)
    cost[lower] = np.inf
    return cost, mns, sizes


def _reduce(
    cost: NDArray[np.float64],
    level: NDArray[np.int64],
    rows: int,
    cfg_rank: NDArray[np.int64],
) -> tuple[NDArray[np.float64], NDArray[np.int16]]:
    """`best[q, ..., m]`, `arg`: the cheapest config of each `[..., m, :]` whose level is at
    least `q`; among equal costs the lowest config rank. `cost`, `level`: `[..., S, C]`."""
    num_submeshes, num_configs = cost.shape[-2:]
    cfg_order = np.argsort(cfg_rank, axis=1)  # [S, C]: the config of each rank
    subs = np.arange(num_submeshes)
    shape = (rows + 1, *cost.shape[:-1])
    exact = np.full(shape, np.inf)  # exact[v]: cheapest config whose level is exactly v
    exact_arg = np.zeros(shape, dtype=np.int16)
    for p in range(num_configs):  # in rank order, so the first of equal costs stays
        c = cfg_order[:, p]
        c_cost, c_level = cost[..., subs, c], level[..., subs, c]
        idx = (c_level + 1)[None]  # slot 0 collects the unusable (-1)
        current = np.take_along_axis(exact, idx, axis=0)[0]
        better = c_cost < current
        np.put_along_axis(exact, idx, np.where(better, c_cost, current)[None], axis=0)
        old = np.take_along_axis(exact_arg, idx, axis=0)[0]
        np.put_along_axis(exact_arg, idx, np.where(better, c, old)[None], axis=0)
    best = np.empty((rows, *cost.shape[:-1]))
    arg = np.zeros(best.shape, dtype=np.int16)
    best[rows - 1], arg[rows - 1] = exact[rows], exact_arg[rows]
    for q in range(rows - 2, -1, -1):  # allowed with q followers: any level >= q
        new, old = exact[q + 1], best[q + 1]
        lower_rank = cfg_rank[subs, exact_arg[q + 1]] < cfg_rank[subs, arg[q + 1]]
        take = (new < old) | ((new == old) & lower_rank)
        best[q] = np.where(take, new, old)
        arg[q] = np.where(take, exact_arg[q + 1], arg[q + 1])
    return best, arg


def reduce_configs(
    cost: NDArray[np.float64],
    mns: NDArray[np.int64],
    sizes: NDArray[np.int64],
    num_devices: int,
    use_memory_rule: bool = True,
    sub_rank: NDArray[np.int64] | None = None,
    cfg_rank: NDArray[np.int64] | None = None,
) -> _Table:
    """Reduce `[L, L, S, C]` to the cheapest allowed config per memory row (see `_Table`).

    `sub_rank`, `cfg_rank`: the tie order (default: by index)."""
    num_layers, _, num_submeshes, num_configs = cost.shape
    if num_configs > np.iinfo(np.int16).max:
        raise ValueError(f"at most {np.iinfo(np.int16).max} configs per submesh, got {num_configs}")
    if sub_rank is None:
        sub_rank = np.arange(num_submeshes, dtype=np.int64)
    if cfg_rank is None:
        cfg_rank = _config_ranks(None, (num_submeshes, num_configs))
    cap = min(num_layers, num_devices) - 1  # most stages that can follow any stage
    clipped = np.clip(mns, -1, cap)
    usable = np.isfinite(cost) & (clipped >= 0) & (sizes <= num_devices)[None, None, :, None]
    if not use_memory_rule:
        clipped = np.where(clipped >= 0, cap, -1)
    binding = clipped[usable & (clipped < cap)]
    rows = int(binding.max()) + 2 if binding.size else 1
    # A config whose limit is >= rows - 1 is past every binding limit, so it saturates at cap.
    level = np.where(usable, np.minimum(clipped, rows - 1), -1)
    need = (2 * rows + 1) * num_layers * num_layers * num_submeshes * 10  # float64 + int16
    if need > MAX_TABLE_BYTES:
        raise ValueError(
            f"the reduced table would take {need / 2**30:.1f} GiB ({rows} memory rows x "
            f"{num_layers}^2 ranges x {num_submeshes} submeshes); the limit is "
            f"{MAX_TABLE_BYTES / 2**30:.0f} GiB: use fewer layers"
        )
    best, arg = _reduce(cost, level, rows, cfg_rank)
    return _Table(
        cost=cost,
        best=best,
        arg=arg,
        sizes=sizes,
        num_devices=num_devices,
        level=level,
        sub_rank=np.asarray(sub_rank, dtype=np.int64),
        cfg_rank=cfg_rank,
    )


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


def _plan_rows(plan: Sequence[Stage], rows: int) -> list[int]:
    """The row of the state before each stage of a plan: its stages left, or the bucket."""
    return [min(len(plan) - j, rows) for j in range(len(plan))]


def _on_table(table: _Table, plan: Sequence[Stage], t_max: float) -> bool:
    """Whether the plan is a path of the recurrence under `t_max` (cost and memory rule)."""
    rows = table.best.shape[0]
    for stage, r in zip(plan, _plan_rows(plan, rows), strict=True):
        cost = float(table.cost[stage])
        if not (math.isfinite(cost) and cost <= t_max and table.level[stage] >= r - 1):
            return False
    return True


def solve_bound_other(table: _Table, t_max: float, plan: Sequence[Stage]) -> list[Stage] | None:
    """The least-sum plan under `t_max` other than `plan`; among those within `REL_TIE` of it,
    the first in the tie order. None when no other plan exists.

    A plan other than `plan` starts in another row, or leaves `plan`'s path at some state
    for good: by another (end, submesh), by the same one with another config, or (in the
    bucket row) by the same stage into the other successor row; and then goes on optimally.
    One solve of the recurrence gives every such value; the least ones are rebuilt.
    """
    if not plan or not _on_table(table, plan, t_max):
        return solve_bound(table, t_max)  # every plan under t_max is another plan
    bt = _forward(table, t_max)
    rows, sizes, off = bt.rows, table.sizes, bt.off
    path_rows = [*_plan_rows(plan, rows), 0]
    final = bt.f[1:, 0, off + table.num_devices]
    # (value, how to build it): ("root", r) | ("config", j, c) | ("successor", j, row);
    # leaving by another (end, submesh) at stage j: edges[j] = values over [end - i, submesh]
    options: list[tuple[float, tuple[int | str, ...]]] = [
        (float(final[r - 1]), ("root", r))
        for r in range(1, rows + 1)
        if r != path_rows[0] and math.isfinite(final[r - 1])
    ]
    edges: list[NDArray[np.float64]] = []
    prefix, d = 0.0, table.num_devices
    for j, (i, e, m, c) in enumerate(plan):
        r, after = path_rows[j], d - int(sizes[m])
        before = bt.prev[r - 1][i + 1 :, np.maximum(off + d - sizes, 0)]  # [L - i, S]
        values = prefix + (before + bt.allowed[r - 1, i, i:, :])
        values[e - i, m] = np.inf
        edges.append(values)
        rest = float(bt.prev[r - 1][e + 1, off + after])
        for c2 in _other_configs(table, (i, e, m, c), r - 1, t_max):
            options.append((prefix + float(table.cost[i, e, m, c2]) + rest, ("config", j, c2)))
        cost = float(table.cost[i, e, m, c])
        if r == rows:
            other = rows - 1 if path_rows[j + 1] == rows else rows
            alt = float(bt.f[other, e + 1, off + after])
            if math.isfinite(alt):
                options.append((prefix + cost + alt, ("successor", j, other)))
        prefix += cost
        d = after
    least = min([v for v, _ in options] + [float(v.min()) for v in edges])
    if not math.isfinite(least):
        return None
    limit = _tie_limit(least)
    near = [how for v, how in options if v <= limit]
    for j, values in enumerate(edges):
        for x, y in zip(*np.nonzero(values <= limit), strict=True):
            near.append(("edge", j, int(x) + plan[j][0], int(y)))
    built = [_rebuild(bt, plan, path_rows, how) for how in near]
    return min(built, key=table.order_key)


def _other_configs(table: _Table, stage: Stage, row: int, t_max: float) -> list[int]:
    """The cheapest configs other than the stage's own of its (start, end, submesh), allowed
    at memory row `row` under `t_max` (all of equal cost)."""
    i, e, m, c = stage
    costs = np.where(table.level[i, e, m] >= row, table.cost[i, e, m], np.inf)
    costs[c] = np.inf
    costs[costs > t_max] = np.inf
    if not np.isfinite(costs).any():
        return []
    return np.flatnonzero(costs == costs.min()).tolist()


def _rebuild(
    bt: "_Backtrack", plan: Sequence[Stage], path_rows: list[int], how: tuple[int | str, ...]
) -> list[Stage]:
    """The plan an option of `solve_bound_other` stands for."""
    kind, j = how[0], int(how[1])
    if kind == "root":
        return bt.path(j)
    i, e, m, c = plan[j]
    r, d = path_rows[j], bt.table.num_devices - sum(int(bt.sizes[s[2]]) for s in plan[:j])
    if kind == "edge":
        e, m = int(how[2]), int(how[3])
        c = int(bt.table.arg[r - 1, i, e, m])
    elif kind == "config":
        c = int(how[2])
    after = d - int(bt.sizes[m])
    row = int(how[2]) if kind == "successor" else bt.successor_row(r, e + 1, after)
    return [*plan[:j], (i, e, m, c), *bt.path(row, e + 1, after)]


def stage_costs(cost: NDArray[np.float64], stages: Sequence[Stage]) -> list[float]:
    """The table's cost of each stage."""
    return [float(cost[s]) for s in stages]


def pipeline_cost(costs: Sequence[float], num_microbatches: int) -> float:
    """Alpa's objective: `sum(t) + (B - 1) * max(t)`, summed first stage first."""
    return float(sum(costs) + (num_microbatches - 1) * max(costs))


def _prepare(
    compute_cost: ArrayLike,
    max_n_succ_stages: ArrayLike | None,
    submesh_choices: Sequence[SubmeshLike],
    num_devices: int,
    config_rank: ArrayLike | None,
    use_memory_rule: bool = True,
) -> _Table:
    cost, mns, sizes = validate_inputs(
        compute_cost, max_n_succ_stages, submesh_choices, num_devices
    )
    cfg_rank = _config_ranks(config_rank, (cost.shape[2], cost.shape[3]))
    sub_rank = submesh_ranks(submesh_choices)
    return reduce_configs(cost, mns, sizes, num_devices, use_memory_rule, sub_rank, cfg_rank)


def training_dp(
    compute_cost: ArrayLike,
    max_n_succ_stages: ArrayLike | None,
    submesh_choices: Sequence[SubmeshLike],
    num_devices: int,
    num_microbatches: int,
    config_rank: ArrayLike | None = None,
) -> DPResult:
    """Pipeline stages minimising `sum(t) + (B-1) * max(t)` on exactly `num_devices`.

    `compute_cost`, `max_n_succ_stages`: shape `[L, L, S, C]` indexed
    `[start, end_inclusive, submesh, config]`; inf cost = infeasible or missing; a stage
    with `s` stages after it needs `s <= max_n_succ_stages` (None: no memory limit).
    `config_rank[submesh, config]` (shape `[S, C]`, any sortable numbers): the configs' order
    for ties (default: their index); see the module docstring for the whole tie order.
    Returns `DPResult(cost=inf, stages=[])` when no plan exists; ValueError on NaN.
    """
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    table = _prepare(compute_cost, max_n_succ_stages, submesh_choices, num_devices, config_rank)
    walk = _BoundSearch(table, num_microbatches)
    walk.run()
    cost, stages = walk.result()
    logger.debug("training_dp: %d bounds solved, cost %s", walk.solved, cost)
    return DPResult(
        cost=cost,
        stages=stages,
        num_bounds_solved=walk.solved,
        table=table,
    )


def runner_up_dp(
    compute_cost: ArrayLike,
    max_n_succ_stages: ArrayLike | None,
    submesh_choices: Sequence[SubmeshLike],
    num_devices: int,
    num_microbatches: int,
    chosen: DPResult | Sequence[Stage],
    config_rank: ArrayLike | None = None,
) -> DPResult:
    """The best plan other than `chosen` under `training_dp`'s objective and tie order.

    Same arguments as `training_dp`; `chosen` is a plan's stages, or `training_dp`'s result
    on the same inputs (whose reduced table is then reused). The same walk over the bounds
    as `training_dp`, each bound solved for the least-sum plan other than `chosen`
    (`solve_bound_other`). Returns `DPResult(cost=inf, stages=[])` when no other plan exists.
    """
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    given = chosen.table if isinstance(chosen, DPResult) else None
    table = given or _prepare(
        compute_cost, max_n_succ_stages, submesh_choices, num_devices, config_rank
    )
    stages_of = chosen.stages if isinstance(chosen, DPResult) else chosen
    walk = _BoundSearch(table, num_microbatches, other_than=[_as_stage(s) for s in stages_of])
    walk.run()
    cost, stages = walk.result()
    logger.debug("runner_up_dp: %d bounds solved, cost %s", walk.solved, cost)
    return DPResult(cost=cost, stages=stages, num_bounds_solved=walk.solved)


def _as_stage(stage: Sequence[int]) -> Stage:
    start, end, m, c = (int(x) for x in stage)
    return (start, end, m, c)


def _first_of_best(
    table: _Table, found: Sequence[tuple[float, list[Stage]]]
) -> tuple[float, list[Stage]]:
    """The least objective, and among the plans tied with it the first in the tie order."""
    if not found:
        return math.inf, []
    limit = _tie_limit(min(cost for cost, _ in found))
    tied = [(table.order_key(stages), cost, stages) for cost, stages in found if cost <= limit]
    _, cost, stages = min(tied, key=lambda t: t[0])
    return cost, stages


class _BoundSearch:
    """The walk over the bounds `t_max` (the distinct stage costs, `values`), top down.

    Solving at `t` gives a plan with least sum `S` and largest stage `M <= t`; every bound in
    `[M, t]` has that least sum, so the walk goes on below `M`. A plan whose largest stage is
    `v` and that lies below a solved bound costs at least `S + (B-1) * v` and at least
    `B * v` (Alpa's stop rule), so only bounds `v` under both limits (or tied with the best,
    for the tie order) are worth solving; and none lies below the least largest stage of
    any plan (one max-plus solve). With B = 1 the objective is the sum and the first solve
    holds every optimal plan. `ceiling`: an objective known to be reachable (prunes more).
    `other_than`: walk over the plans other than this one (the max-plus solve, a lower
    bound, may still return it; it is then not kept).
    """

    def __init__(
        self,
        table: _Table,
        num_microbatches: int,
        ceiling: float = math.inf,
        other_than: list[Stage] | None = None,
    ) -> None:
        self.table = table
        self.micro = num_microbatches
        self.values = np.unique(table.best[np.isfinite(table.best)])
        self.best_cost = ceiling
        self.found: list[tuple[float, list[Stage]]] = []
        self.solved = 0
        self.other_than = other_than

    def solve(self, t_max: float, combine: str = "sum") -> tuple[float, float] | None:
        """Solve one bound; keep its plan; return (sum, max) of the plan or None."""
        if self.other_than is not None and combine == "sum":
            stages = solve_bound_other(self.table, t_max, self.other_than)
        else:
            stages = solve_bound(self.table, t_max, combine)
        self.solved += 1
        if stages is None:
            return None
        costs = stage_costs(self.table.cost, stages)
        if stages != self.other_than:
            value = pipeline_cost(costs, self.micro)
            self.found.append((value, stages))
            self.best_cost = min(self.best_cost, value)
        return sum(costs), max(costs)

    def result(self) -> tuple[float, list[Stage]]:
        return _first_of_best(self.table, self.found)

    def promising(self, least_sum: float) -> int:
        """Index of the largest bound `v` with `least_sum + (B-1) v` and `B v` below the best
        (B > 1: or tied with it)."""
        b = self.micro
        if b == 1:
            return -1
        best = _tie_limit(self.best_cost)
        limit = min(best / b, (best - least_sum) / (b - 1))
        limit += 1e-9 * abs(limit)  # the divisions round; the loop below checks exactly
        idx = int(np.searchsorted(self.values, limit, side="right")) - 1
        while idx >= 0:
            v = float(self.values[idx])
            if least_sum + (b - 1) * v <= best and b * v <= best:
                break
            idx -= 1
        return idx

    def run(self) -> None:
        if self.other_than:
            # Plans close to the excluded one are likely close to it in cost: the bound of
            # its largest stage gives a good first best, which prunes the walk.
            self.solve(max(stage_costs(self.table.cost, self.other_than)))
        top = self.solve(math.inf)
        if top is None:
            return
        least_sum, largest = top
        hi = int(np.searchsorted(self.values, largest, side="left")) - 1
        lo = -1  # unknown until the max-plus solve
        while True:
            hi = min(hi, self.promising(least_sum))
            if hi < max(lo, 0):
                return
            if lo < 0:
                floor = self.solve(math.inf, combine="max")
                if floor is None:
                    raise AssertionError("a plan exists but the max-plus solve found none")
                lo = int(np.searchsorted(self.values, floor[1], side="left"))
                continue
            found = self.solve(float(self.values[hi]))
            if found is None:
                return
            least_sum, largest = found
            hi = min(hi, int(np.searchsorted(self.values, largest, side="left"))) - 1


def inference_dp(
    compute_cost: ArrayLike,
    max_n_succ_stages: ArrayLike | None,
    submesh_choices: Sequence[SubmeshLike],
    num_devices: int,
    config_rank: ArrayLike | None = None,
) -> DPResult:
    """Pipeline stages minimising the largest stage time (a pipeline's throughput bound).

    Same inputs as `training_dp`; nothing is stashed for a backward pass, so the 1F1B rule
    does not apply and only `max_n_succ_stages < 0` (does not fit at all) excludes a
    candidate. Among plans with the least largest stage it returns one with the least sum
    (ties: the first in `training_dp`'s tie order). `cost` is the largest stage time.
    (Alpa's `inference_dp` multiplies it by the stage count.)
    """
    table = _prepare(
        compute_cost, max_n_succ_stages, submesh_choices, num_devices, config_rank, False
    )
    bottleneck = solve_bound(table, math.inf, combine="max")
    if bottleneck is None:
        return DPResult(cost=math.inf, stages=[], num_bounds_solved=1)
    t_max = max(stage_costs(table.cost, bottleneck))
    stages = solve_bound(table, t_max) or bottleneck
    return DPResult(cost=max(stage_costs(table.cost, stages)), stages=stages, num_bounds_solved=2)
