"""The DP's inputs: checked (`validate_inputs`) and reduced over configs (`reduce_configs`)
into the `_Table` that every bound of `planner.dp` is solved on."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from planner.ranks import (
    OrderKey,
    Stage,
    SubmeshLike,
    _config_ranks,
    _submesh_shapes,
    plan_order_key,
    submesh_ranks,
)

MAX_TABLE_BYTES = 2 * 2**30  # working arrays of one DP; beyond it, refuse instead of swapping


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
        """The plan's place in the tie order (see `planner.dp`'s docstring)."""
        return plan_order_key(stages, self.sub_rank, self.cfg_rank)


def _where(mask: NDArray[np.bool_]) -> str:
    idx = tuple(int(x) for x in np.argwhere(mask)[0])
    return f"[start, end, submesh, config] = {idx} ({int(mask.sum())} entries)"


def _submesh_sizes(submesh_choices: Sequence[SubmeshLike]) -> NDArray[np.int64]:
    return np.array([h * d for h, d in _submesh_shapes(submesh_choices)], dtype=np.int64)


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


def _prepare(
    compute_cost: ArrayLike,
    max_n_succ_stages: ArrayLike | None,
    submesh_choices: Sequence[SubmeshLike],
    num_devices: int,
    config_rank: ArrayLike | None,
    use_memory_rule: bool = True,
) -> _Table:
    """`validate_inputs`, then `reduce_configs` with the tie order's ranks."""
    cost, mns, sizes = validate_inputs(
        compute_cost, max_n_succ_stages, submesh_choices, num_devices
    )
    cfg_rank = _config_ranks(config_rank, (cost.shape[2], cost.shape[3]))
    sub_rank = submesh_ranks(submesh_choices)
    return reduce_configs(cost, mns, sizes, num_devices, use_memory_rule, sub_rank, cfg_rank)
