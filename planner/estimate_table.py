"""Every stage's estimate at once, as the planner's `[L, L, S, C]` cost table.

The same estimates as `StageEstimator.estimate` (see planner.estimate), computed with
prefix sums over the layers instead of one stage at a time, so a round of the estimate
search costs array operations, not a Python object per candidate. Measured stages keep
their measured numbers; the estimated ones are filled in where the layer profiles allow.
"""

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from planner.estimate import Quantities, StageEstimator
from planner.estimate_result import estimated_result
from planner.layer_profiles import is_layer_profile
from planner.table import CostTable, Key
from schemas import (
    ModuleKind,
    ProfileStatus,
    StageProfileResult,
    max_n_succ_stages,
)

FloatArray = NDArray[np.float64]
MODULES = {
    "forward": ModuleKind.forward,
    "backward": ModuleKind.backward,
    "input_grad": ModuleKind.backward_input,
    "weight_grad": ModuleKind.backward_weight,
}
SIZE_FIELDS = ("initial_var_size", "intermediate_size", "weight_stash_size")


def _additive(singles: FloatArray, pairs: FloatArray, same: NDArray[np.bool_]) -> FloatArray:
    """`[L, L]`: Σ singles over a..b plus Σ (pair - its two singles) over the boundaries
    (0 at an unmeasured boundary of two identical layers, `same`); NaN where a value it
    needs is NaN."""
    num = len(singles)
    bad1 = np.concatenate([[0], np.cumsum(np.isnan(singles))])
    delta = pairs - singles[:-1] - singles[1:] if num > 1 else np.zeros(0)
    delta = np.where(np.isnan(pairs) & same, 0.0, delta)
    bad2 = np.concatenate([[0], np.cumsum(np.isnan(delta))])
    s1 = np.concatenate([[0.0], np.cumsum(np.nan_to_num(singles))])
    d = np.concatenate([[0.0], np.cumsum(np.nan_to_num(delta))])
    a, b = np.meshgrid(np.arange(num), np.arange(num), indexing="ij")
    out = s1[b + 1] - s1[a] + d[b] - d[np.minimum(a, b)]
    invalid = (bad1[b + 1] - bad1[a] > 0) | (bad2[b] - bad2[np.minimum(a, b)] > 0) | (b < a)
    return np.where(invalid, np.nan, out)


def _range_max(values: FloatArray) -> FloatArray:
    """`[L, L]`: the largest value over a..b (NaN propagates)."""
    num = len(values)
    out = np.full((num, num), np.nan)
    out[np.arange(num), np.arange(num)] = values
    for length in range(1, num):
        a = np.arange(num - length)
        out[a, a + length] = np.maximum(out[a, a + length - 1], values[a + length])
    return out


@dataclasses.dataclass(frozen=True)
class EstimatedTable:
    """The cost table with estimates filled in, which keys are estimates, and which keys'
    split backward is estimated (`planner.split_estimate`)."""

    table: CostTable
    estimated: frozenset[Key]
    split_estimated: frozenset[Key] = frozenset()


def estimated_table(
    estimator: StageEstimator,
    measured: CostTable,
    candidates: set[Key],
    num_layers: int,
    scaled: frozenset[Key] = frozenset(),
) -> EstimatedTable:
    """`measured` (built from the measured results) with every unmeasured candidate that
    can be estimated filled in; `scaled` (whole-model stages on every device, see
    `planner.with_layer_profiles`) from the fastest estimate of the whole model on the
    nearest smaller submesh size, perfectly scaled (its times and memory times d / D for d
    of its devices and D of every device), the times then multiplied by the shortfall from
    perfect scaling (`scaling_shortfall`: what the measured ones showed, else the step
    below); a whole-model stage whose config's layers were measured on demand
    (`planner.layer_profiles.on_demand_profiles`) from them instead."""
    arrays = {
        name: np.array(getattr(measured, name))
        for name in (
            "forward",
            "backward",
            "input_grad",
            "weight_grad",
            "max_n_succ_stages",
            "free_bytes",
            "intermediate",
            "weight_stash",
            "fixed_bytes",
            "available",
        )
    }
    gamma = estimator.length_exponent()
    corrections = estimator.corrections()
    n = np.arange(num_layers)
    length = (n[None, :] - n[:, None] + 1).astype(np.float64)
    law = np.where(length > 2, (np.maximum(length, 2) / 2) ** gamma, 1.0)
    known = {k for k in estimator.results}
    # a whole-model stage whose layers were measured on demand is estimated from them
    by_scaling = frozenset(
        k for k in scaled if is_layer_profile(k) or not estimator.profiled(k[2], k[3])
    )
    estimated: set[Key] = set()
    results: dict[Key, StageProfileResult] = dict(measured.results)
    lazy: dict[Key, tuple[int, int]] = {}
    mesh_of: dict[tuple[int, int], dict[str, FloatArray]] = {}
    for m, c in sorted({(k[2], k[3]) for k in candidates}):
        wanted = [k for k in candidates if k[2:] == (m, c) and k not in known | by_scaling]
        if not wanted:
            continue
        est = _mesh_estimates(estimator, m, c, num_layers, law, corrections)
        if est is None:
            continue
        mesh_of[(m, c)] = est
        for key in wanted:
            a, b = key[0], key[1]
            if not np.isfinite(est["forward"][a, b]) or not np.isfinite(est["backward"][a, b]):
                continue
            for name in ("forward", "backward", "input_grad", "weight_grad"):
                value = est[name][a, b]
                arrays[name][key] = value if np.isfinite(value) else np.inf
            avail = float(estimator.available_memory)
            fixed = est["peak"][a, b] + est["initial_var_size"][a, b]
            inter = est["intermediate_size"][a, b]
            arrays["available"][key] = avail
            arrays["fixed_bytes"][key] = fixed
            arrays["free_bytes"][key] = avail - fixed
            arrays["intermediate"][key] = inter
            arrays["weight_stash"][key] = est["weight_stash_size"][a, b]
            arrays["max_n_succ_stages"][key] = _succ(avail, fixed, inter)
            estimated.add(key)
            lazy[key] = (m, c)
    shortfall = scaling_shortfall(arrays, scaled, estimator)
    for key in sorted(by_scaling - known):
        if _scale_into(arrays, key, estimator, shortfall):
            estimated.add(key)
    table = dataclasses.replace(
        measured,
        results=_LazyResults(results, lazy, mesh_of, estimator, by_scaling - known),
        forward=arrays["forward"],
        backward=arrays["backward"],
        input_grad=arrays["input_grad"],
        weight_grad=arrays["weight_grad"],
        max_n_succ_stages=arrays["max_n_succ_stages"],
        free_bytes=arrays["free_bytes"],
        intermediate=arrays["intermediate"],
        weight_stash=arrays["weight_stash"],
        fixed_bytes=arrays["fixed_bytes"],
        available=arrays["available"],
    )
    assert isinstance(table.results, _LazyResults)
    table.results.table = table
    return EstimatedTable(table, frozenset(estimated))


def _scaling_source(
    arrays: dict[str, FloatArray], key: Key, estimator: StageEstimator
) -> tuple[Key, float] | None:
    """The fastest stage of `key`'s layers on the nearest smaller submesh size (the most
    devices under `key`'s that has one) and its device ratio d / D."""
    a, b, m, _ = key
    devices = [s.num_devices for s in estimator.space.submeshes]
    for size in sorted({d for d in devices if d < devices[m]}, reverse=True):
        best: tuple[float, Key] | None = None
        for other in (o for o, d in enumerate(devices) if d == size):
            for c in range(arrays["forward"].shape[3]):
                t = _time(arrays, (a, b, other, c))
                if np.isfinite(t) and (best is None or t < best[0]):
                    best = (t, (a, b, other, c))
        if best is not None:
            return best[1], size / devices[m]
    return None


def scaling_shortfall(
    arrays: dict[str, FloatArray], scaled: frozenset[Key], estimator: StageEstimator
) -> float:
    """How far from perfect scaling the whole cluster's stages are: the smallest measured /
    perfectly-scaled time over the scaled stages measured so far; before one is measured,
    the shortfall the step below showed (`prior_shortfall`)."""
    ratios = []
    for key in scaled:
        result = estimator.results.get(key)
        source = _scaling_source(arrays, key, estimator)
        if result is None or not result.ok or source is None:
            continue
        src, ratio = source
        bound = _time(arrays, src) * ratio
        if bound > 0:
            ratios.append(result.compute_cost / bound)
    return min(ratios) if ratios else prior_shortfall(arrays, scaled, estimator)


def prior_shortfall(
    arrays: dict[str, FloatArray], scaled: frozenset[Key], estimator: StageEstimator
) -> float:
    """The shortfall from perfect scaling the step below the whole cluster showed, carried
    one step further: source (`_scaling_source`, d devices) against the stage on the size
    below it (d' devices) perfectly scaled up is r, and D / d is (d / d')^k of that step,
    so r^k; at least 1 (never more optimistic than perfect scaling), 1 when the source is
    the smallest submesh. An estimate the search verifies like any other."""
    ratios = []
    for key in scaled:
        source = _scaling_source(arrays, key, estimator)
        below = None if source is None else _scaling_source(arrays, source[0], estimator)
        if source is None or below is None:
            continue
        (src, up), (low, step) = source, below  # both ratios under 1: fewer devices
        bound = _time(arrays, low) * step
        if bound > 0:
            ratios.append((_time(arrays, src) / bound) ** (math.log(up) / math.log(step)))
    return max(1.0, min(ratios, default=1.0))


def _time(arrays: dict[str, FloatArray], key: Key) -> float:
    """forward + backward of one stage of the table being filled."""
    return float(arrays["forward"][key] + arrays["backward"][key])


def _scale_into(
    arrays: dict[str, FloatArray], key: Key, estimator: StageEstimator, shortfall: float
) -> bool:
    """Fill `key` (the whole model on every device) from its source (`_scaling_source`),
    perfectly scaled, times `shortfall` (`scaling_shortfall`); False when there is none."""
    source = _scaling_source(arrays, key, estimator)
    if source is None:
        return False
    src, ratio = source
    for name in ("forward", "backward", "input_grad", "weight_grad"):
        arrays[name][key] = arrays[name][src] * ratio * shortfall
    avail = float(estimator.available_memory)
    fixed = float(arrays["fixed_bytes"][src]) * ratio
    inter = float(arrays["intermediate"][src]) * ratio
    arrays["available"][key] = avail
    arrays["fixed_bytes"][key] = fixed
    arrays["free_bytes"][key] = avail - fixed
    arrays["intermediate"][key] = inter
    arrays["weight_stash"][key] = float(arrays["weight_stash"][src]) * ratio
    arrays["max_n_succ_stages"][key] = _succ(avail, fixed, inter)
    return True


def _succ(available: float, fixed: float, intermediate: float) -> int:
    return max_n_succ_stages(available, max(0.0, fixed), 0.0, max(0.0, intermediate))


def _mesh_estimates(
    estimator: StageEstimator,
    m: int,
    c: int,
    num_layers: int,
    law: FloatArray,
    corrections: Mapping[tuple[int, int] | None, tuple[float, float]],
) -> dict[str, FloatArray] | None:
    """`[L, L]` arrays of one submesh and config: module times, peak and sizes."""
    singles: dict[str, FloatArray] = {}
    pairs: dict[str, FloatArray] = {}
    fields = [*MODULES, "peak", *SIZE_FIELDS]
    for name in fields:
        singles[name] = np.full(num_layers, np.nan)
        pairs[name] = np.full(max(0, num_layers - 1), np.nan)
    for key, result in estimator.profiles().items():
        if key[2:] != (m, c) or not result.ok:
            continue
        _put(singles if key[0] == key[1] else pairs, key[0], Quantities.of(result))
    if np.isnan(singles["forward"]).all():
        return None
    classes = np.asarray(estimator.layer_classes)
    same = classes[:-1] == classes[1:]
    for k in np.flatnonzero(~same & np.isnan(pairs["forward"])):
        _put(pairs, int(k), estimator.pair(int(k), m, c))  # the reference's boundary
    out: dict[str, FloatArray] = {}
    valid = ~np.isnan(_additive(singles["forward"], pairs["forward"], same))
    for name, kind in MODULES.items():
        coef = estimator._fit(m, c, kind)
        if coef is None:
            out[name] = np.full((num_layers, num_layers), np.nan)
            continue
        out[name] = _modelled(coef, estimator.layer_classes, num_layers) * law
        floor = _range_max(singles[name])
        out[name] = np.where(valid, np.fmax(out[name], floor), np.nan)
    _, p_scale = corrections.get((m, c), corrections.get(None, (1.0, 1.0)))
    peak = _additive(singles["peak"], pairs["peak"], same) * p_scale
    out["peak"] = np.fmax(peak, _range_max(singles["peak"]))
    for name in SIZE_FIELDS:
        out[name] = np.maximum(_additive(singles[name], pairs[name], same), 0.0)
    return out


def _put(arrays: dict[str, FloatArray], k: int, q: Quantities | None) -> None:
    """Entry `k` of every array from `q` (left NaN where `q` lacks a value)."""
    if q is None:
        return
    for name, kind in MODULES.items():
        arrays[name][k] = q.times.get(kind, np.nan)
    arrays["peak"][k] = q.peak
    for name in SIZE_FIELDS:
        arrays[name][k] = q.sizes[name]


def _modelled(coef: FloatArray, classes: Sequence[int], num_layers: int) -> FloatArray:
    """`[L, L]`: o + Σ μ over a..b (NaN where a class was never measured; below the
    diagonal meaningless)."""
    onehot = np.zeros((num_layers, len(coef) - 1))
    onehot[np.arange(num_layers), np.asarray(classes[:num_layers])] = 1.0
    prefix = np.vstack([np.zeros(len(coef) - 1), np.cumsum(onehot, axis=0)])
    counts = prefix[None, 1:, :] - prefix[:-1, None, :]  # [a, b, class]
    mu = np.where(np.isnan(coef[1:]), 0.0, coef[1:])
    missing = (counts[..., np.isnan(coef[1:])] > 0).any(axis=-1)
    return np.where(missing, np.nan, coef[0] + counts @ mu)


class _LazyResults(Mapping[Key, StageProfileResult]):
    """Measured results, and estimated ones made when asked for (a plan's stages)."""

    def __init__(
        self,
        measured: dict[Key, StageProfileResult],
        lazy: dict[Key, tuple[int, int]],
        mesh_of: dict[tuple[int, int], dict[str, FloatArray]],
        estimator: StageEstimator,
        scaled: frozenset[Key] = frozenset(),
    ) -> None:
        self._measured, self._lazy, self._mesh_of = measured, lazy, mesh_of
        self._estimator = estimator
        self._scaled = scaled
        self._made: dict[Key, StageProfileResult] = {}
        self.table: CostTable | None = None  # set once the table exists (scaled keys)

    def __getitem__(self, key: Key) -> StageProfileResult:
        if key in self._measured:
            return self._measured[key]
        if key in self._scaled and self.table is not None and key not in self._made:
            self._made[key] = _from_table(self.table, key, self._estimator)
        if key in self._made:
            return self._made[key]
        if key not in self._lazy:
            raise KeyError(key)
        if key not in self._made:
            made = self._estimator.estimate(key)
            if made is None or made.status != ProfileStatus.ok:
                raise KeyError(key)
            self._made[key] = made
        return self._made[key]

    def __iter__(self) -> Iterator[Key]:
        yield from self._measured
        yield from (k for k in self._lazy if k not in self._measured)
        yield from (k for k in self._scaled if k not in self._measured)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _from_table(table: CostTable, key: Key, estimator: StageEstimator) -> StageProfileResult:
    """A scaled estimate as a result, from the table's numbers (its peak holds the
    parameters and optimizer state too: `fixed_bytes`)."""
    submesh, config = estimator.space.resolve(key)
    times = {
        kind: float(getattr(table, name)[key])
        for name, kind in MODULES.items()
        if np.isfinite(getattr(table, name)[key])
    }
    return estimated_result(
        submesh,
        config,
        key[1] - key[0] + 1,
        times,
        peak=int(table.fixed_bytes[key]),
        initial=0,
        intermediate=int(table.intermediate[key]),
        weight_stash=int(table.weight_stash[key]),
        available=estimator.available_memory,
    )
