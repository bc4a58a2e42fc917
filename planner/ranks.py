"""The DP's tie order (see `planner.dp`'s docstring), and the stage and submesh types.

Objectives within a relative `REL_TIE` of each other are tied (`_tie_limit`); among tied
plans the DP returns the one with the smallest `plan_order_key`, which ranks submeshes by
shape (`submesh_ranks`) and configs by the caller's order (`_config_ranks`).
"""

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from schemas import SubmeshShape

Stage = tuple[int, int, int, int]  # (start, end_inclusive, submesh, config)
OrderKey = tuple[int, tuple[tuple[int, int, int, int], ...]]
REL_TIE = 1e-12  # objectives within this relative distance are tied
SubmeshLike = tuple[int, int] | SubmeshShape


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


def _submesh_shapes(submesh_choices: Sequence[SubmeshLike]) -> list[tuple[int, int]]:
    """`(hosts, devices_per_host)` of each submesh; ValueError unless both are positive."""
    shapes = []
    for s in submesh_choices:
        hosts, devices = s.as_tuple() if isinstance(s, SubmeshShape) else s
        if hosts < 1 or devices < 1:
            raise ValueError(f"submesh {s} must have positive sizes")
        shapes.append((int(hosts), int(devices)))
    return shapes


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
