"""Stage numbers estimated from layer profiles (Alpa's layer-wise profiling, PR #681).

A stage of layers a..b on one submesh and config is estimated from the measured stages of
one layer, `(k, k)`, and of two adjacent layers, `(k, k + 1)`, on the same submesh and
config. An additive quantity `q` (a module's time, stash bytes, parameter bytes, FLOPs) of
the stage is

    q(a..b) = Σ_k q(k, k) + Σ_{k<b} [q(k, k+1) - q(k, k) - q(k+1, k+1)]

the layers' own values plus what each boundary between two layers changes (an activation
that is both an output and an input). It is exact for one and two layers; sizes and peak
memory are estimated so, and the peak is scaled per submesh and config by the median ratio
of measured to estimated over the longer stages measured so far. Times come from a fitted
model instead (`planner.time_model`: a per-call overhead plus each layer's marginal time,
fitted to the layer profiles by least squares, which does not amplify timing noise the way
pairwise differences do), times a length law `(n / 2)^γ` for a stage of n > 2 layers, with
γ learned from the longer stages measured so far (what they cost beyond their layers:
caches, memory traffic; in a job that searches counts of micro-batches, from those measured
at the other counts' sizes until one is measured at this one's; 0 until one is measured).
"""

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from planner import time_model
from planner.candidates import CandidateSpace
from planner.estimate_result import estimated_result
from planner.layer_profiles import REFERENCE, is_layer_profile
from planner.table import Key
from schemas import ModuleKind, StageProfileResult

TIMED = (
    ModuleKind.forward,
    ModuleKind.backward,
    ModuleKind.apply_grad,
    ModuleKind.backward_input,
    ModuleKind.backward_weight,
)
# The additive stage-level quantities (attribute names of StageProfileResult).
SIZES = ("initial_var_size", "intermediate_size", "weight_stash_size", "flops")
MAX_EXPONENT = 1.0  # the length law's |γ| at most


@dataclass(frozen=True)
class Quantities:
    """The numbers of one stage that estimates add up (times in seconds, sizes in bytes)."""

    times: dict[ModuleKind, float]
    peak: float
    sizes: dict[str, float]

    @staticmethod
    def of(result: StageProfileResult) -> "Quantities":
        times = {m.module: m.compute_cost for m in result.module_profile_results}
        sizes = {name: float(getattr(result, name)) for name in SIZES}
        return Quantities(times, float(result.peak_memory), sizes)

    def combine(self, other: "Quantities", sign: float) -> "Quantities":
        times = {k: self.times[k] + sign * other.times[k] for k in self.times if k in other.times}
        sizes = {k: self.sizes[k] + sign * other.sizes[k] for k in self.sizes}
        return Quantities(times, self.peak + sign * other.peak, sizes)

    def scaled(self, here: "Quantities", there: "Quantities") -> "Quantities":
        """Each quantity times `here / there` of that quantity (unchanged where `there`
        is not positive)."""

        def ratio(a: float, b: float) -> float:
            return a / b if b > 0 else 1.0

        times = {
            k: v * ratio(here.times[k], there.times[k])
            for k, v in self.times.items()
            if k in here.times and k in there.times
        }
        sizes = {k: v * ratio(here.sizes[k], there.sizes[k]) for k, v in self.sizes.items()}
        return Quantities(times, self.peak * ratio(here.peak, there.peak), sizes)


@dataclass
class StageEstimator:
    """Estimates stages from the layer profiles of a job (see the module doc).

    `results`: measured results by key (layer profiles and any longer stages); estimates use
    the ok layer profiles and learn their correction from the ok longer stages. `priors`:
    layer profiles from other micro-batch sizes (`planner.batch_profiles`), not measured."""

    space: CandidateSpace
    available_memory: int
    # each layer's class: layers of one class (equal fingerprints) cost the same
    layer_classes: Sequence[int]
    results: dict[Key, StageProfileResult] = field(default_factory=dict)
    priors: dict[Key, StageProfileResult] = field(default_factory=dict)
    _fits: dict[tuple[int, int, ModuleKind], NDArray[np.float64] | None] = field(
        default_factory=dict
    )
    # the estimators of the same model at other micro-batch sizes (`planner.microbatches`):
    # what longer stages cost beyond their layers is learned from theirs until this one has
    # its own (`length_exponent`, and the search's band: `peer_errors`)
    peers: list["StageEstimator"] = field(default_factory=list, repr=False, compare=False)

    def add(self, key: Key, result: StageProfileResult, prior: bool = False) -> None:
        (self.priors if prior else self.results)[key] = result
        if key[2:] == REFERENCE:
            self._fits.clear()  # the other fits may borrow its overhead
        for kind in TIMED:
            self._fits.pop((key[2], key[3], kind), None)

    def profiles(self) -> dict[Key, StageProfileResult]:
        """The layer profiles estimates are made from: measured, else a prior."""
        out = {k: r for k, r in self.priors.items() if k not in self.results}
        out.update((k, r) for k, r in self.results.items() if is_layer_profile(k))
        return out

    def _fit(self, m: int, c: int, kind: ModuleKind) -> NDArray[np.float64] | None:
        """The time model of one module on submesh `m`, config `c`, fitted to its layer
        profiles (planner.time_model). Where they are all one layer, the per-call overhead
        comes from the `REFERENCE`'s fit (`time_model.fit_singles`)."""
        cached = (m, c, kind)
        if cached in self._fits:
            return self._fits[cached]
        rows = self._rows(m, c, kind)
        num_classes = max(self.layer_classes, default=-1) + 1
        coef = None
        if (m, c) != REFERENCE and not time_model.spans_layers(rows):
            reference = self._fit(*REFERENCE, kind)
            if reference is not None and time_model.spans_layers(self._rows(*REFERENCE, kind)):
                coef = time_model.fit_singles(rows, self.layer_classes, num_classes, reference)
        if coef is None:
            coef = time_model.fit(rows, self.layer_classes, num_classes)
        self._fits[cached] = coef
        return coef

    def _rows(self, m: int, c: int, kind: ModuleKind) -> list[tuple[int, int, float]]:
        """(start, end, seconds) of the module in every ok layer profile of `m`, `c`."""
        rows = []
        for key, result in self.profiles().items():
            if key[2:] != (m, c) or not result.ok:
                continue
            module = result.module(kind)
            if module is not None:
                rows.append((key[0], key[1], module.compute_cost))
        return rows

    def modelled_time(self, key: Key, kind: ModuleKind) -> float:
        """The module's time of the stage from its layer profiles alone (NaN: cannot)."""
        coef = self._fit(key[2], key[3], kind)
        if coef is None:
            return float("nan")
        return time_model.predict(coef, self.layer_classes, key[0], key[1])

    def length_exponent(self, without: str | None = None) -> float:
        """γ of the length law `t = modelled × (n / 2)^γ` for a stage of n > 2 layers: the
        median of `length_samples` (`without`: leaving out the stage of that fingerprint):
        what longer stages cost beyond their layers (caches, memory traffic), learned as
        they are measured. Until this estimator has one, the samples of its `peers` (the
        same model at other micro-batch sizes); 0 when none has."""
        samples = self.length_samples(without)
        if not samples:
            samples = [s for peer in self.peers for s in peer.length_samples()]
        if not samples:
            return 0.0
        return min(MAX_EXPONENT, max(-MAX_EXPONENT, statistics.median(samples)))

    def length_samples(self, without: str | None = None) -> list[float]:
        """log(measured / modelled) / log(n / 2) of each distinct measured longer stage
        (n > 2 layers, forward + backward), but the one of fingerprint `without`."""
        samples = []
        for key, result in self._longer_stages():
            n = key[1] - key[0] + 1
            if without is not None and result.fingerprint == without:
                continue
            modelled = sum(
                self.modelled_time(key, k) for k in (ModuleKind.forward, ModuleKind.backward)
            )
            if math.isfinite(modelled) and modelled > 0 and result.compute_cost > 0:
                samples.append(math.log(result.compute_cost / modelled) / math.log(n / 2))
        return samples

    def _longer_stages(self) -> list[tuple[Key, StageProfileResult]]:
        """One key per distinct measured ok stage of more than two layers."""
        seen: dict[str, tuple[Key, StageProfileResult]] = {}
        for key, result in self.results.items():
            if not is_layer_profile(key) and result.ok:
                seen.setdefault(result.fingerprint, (key, result))
        return list(seen.values())

    def fitted_time(self, key: Key, kind: ModuleKind, exponent: float | None = None) -> float:
        """The module's estimated time of the stage (NaN when it cannot be estimated)."""
        modelled = self.modelled_time(key, kind)
        n = key[1] - key[0] + 1
        if n <= 2:
            return modelled
        gamma = self.length_exponent() if exponent is None else exponent
        return modelled * (n / 2) ** gamma

    def held_out_errors(self) -> list[float]:
        """|estimate - measured| / measured of forward + backward of each measured longer
        stage, with the length law learned from the others (leave one out)."""
        out = []
        for key, result in self._longer_stages():
            gamma = self.length_exponent(without=result.fingerprint)
            est = sum(
                self.fitted_time(key, kind, gamma)
                for kind in (ModuleKind.forward, ModuleKind.backward)
            )
            error = relative_error(est, result.compute_cost)
            if math.isfinite(error):
                out.append(error)
        return out

    def profiled(self, m: int, c: int) -> bool:
        """Whether every layer class has an ok one-layer profile on submesh `m`, config `c`
        (measured, or a prior): its stages can be estimated from them."""
        have = {
            self.layer_classes[k[0]]
            for k, r in self.profiles().items()
            if k[0] == k[1] and k[2:] == (m, c) and r.ok
        }
        return have == set(self.layer_classes)

    def peer_errors(self) -> list[float]:
        """The `held_out_errors` of every peer: how far estimates of the model's longer
        stages missed at the other micro-batch sizes."""
        return [e for peer in self.peers for e in peer.held_out_errors()]

    def raw(self, key: Key) -> Quantities | None:
        """The additive estimate before correction; None when a layer profile it needs is
        missing or failed."""
        a, b, m, c = key
        total: Quantities | None = None
        for k in range(a, b + 1):
            one = self._ok((k, k, m, c))
            if one is None:
                return None
            total = one if total is None else total.combine(one, 1.0)
        for k in range(a, b):
            left, right = self._ok((k, k, m, c)), self._ok((k + 1, k + 1, m, c))
            if self.layer_classes[k] == self.layer_classes[k + 1] and (
                self._ok((k, k + 1, m, c)) is None
            ):
                continue  # identical layers: sizes add, times come from the fitted model
            pair = self.pair(k, m, c)
            if pair is None or left is None or right is None:
                return None
            assert total is not None
            total = total.combine(pair, 1.0).combine(left, -1.0).combine(right, -1.0)
        return total

    def pair(self, k: int, m: int, c: int) -> Quantities | None:
        """Layers k and k + 1 as one stage on `m`, `c`: measured, else the two layers plus
        the boundary the `REFERENCE` measured between them, each quantity scaled by what the
        two layers are here against there; None when neither can be had."""
        measured = self._ok((k, k + 1, m, c))
        if measured is not None:
            return measured
        left, right = self._ok((k, k, m, c)), self._ok((k + 1, k + 1, m, c))
        pair = self._ok((k, k + 1, *REFERENCE))
        ref_left, ref_right = self._ok((k, k, *REFERENCE)), self._ok((k + 1, k + 1, *REFERENCE))
        if left is None or right is None or pair is None or ref_left is None or ref_right is None:
            return None
        here, there = left.combine(right, 1.0), ref_left.combine(ref_right, 1.0)
        return here.combine(pair.combine(there, -1.0).scaled(here, there), 1.0)

    def _ok(self, key: Key) -> Quantities | None:
        result = self.results.get(key, self.priors.get(key))
        return Quantities.of(result) if result is not None and result.ok else None

    def corrections(self) -> dict[tuple[int, int] | None, tuple[float, float]]:
        """(time, peak) scale per (submesh, config): the median measured / raw over its
        measured longer stages; under None, over every submesh's (used where a submesh and
        config has none; absent when no longer stage is measured: no correction). Times
        come from the time model; the time scale is what the additive raw estimate misses."""
        by_mesh: dict[tuple[int, int] | None, list[tuple[float, float]]] = {}
        for key, result in self.results.items():
            if is_layer_profile(key) or not result.ok:
                continue
            raw = self.raw(key)
            if raw is None:
                continue
            t_raw = _stage_time(raw)
            if t_raw <= 0 or raw.peak <= 0:
                continue
            pair = (result.compute_cost / t_raw, result.peak_memory / raw.peak)
            by_mesh.setdefault(None, []).append(pair)
            by_mesh.setdefault((key[2], key[3]), []).append(pair)
        return {
            mesh: (statistics.median(p[0] for p in v), statistics.median(p[1] for p in v))
            for mesh, v in by_mesh.items()
        }

    def estimate(
        self,
        key: Key,
        fingerprint: str = "",
        corrections: Mapping[tuple[int, int] | None, tuple[float, float]] | None = None,
        exponent: float | None = None,
    ) -> StageProfileResult | None:
        """The stage's estimated result (status ok), or None when it cannot be estimated.
        Times are never below the measured layers' largest (a stage takes at least as long
        as any of its layers)."""
        raw = self.raw(key)
        if raw is None:
            return None
        a, b, m, c = key
        corr = self.corrections() if corrections is None else corrections
        _, p_scale = corr.get((m, c), corr.get(None, (1.0, 1.0)))
        gamma = self.length_exponent() if exponent is None else exponent
        times = {}
        for kind, additive in raw.times.items():
            fitted = self.fitted_time(key, kind, gamma)
            times[kind] = max(0.0, fitted if math.isfinite(fitted) else additive)
        peak = max(0, int(raw.peak * p_scale))
        sizes = {k: max(0.0, v) for k, v in raw.sizes.items()}
        for k in range(a, b + 1):
            one = self._ok((k, k, m, c))
            assert one is not None
            for kind, t in one.times.items():
                if kind in times:
                    times[kind] = max(times[kind], t)
            peak = max(peak, int(one.peak))
        submesh, config = self.space.resolve(key)
        return estimated_result(
            submesh,
            config,
            b - a + 1,
            {kind: times[kind] for kind in TIMED if kind in times},
            peak=peak,
            initial=int(sizes["initial_var_size"]),
            intermediate=int(sizes["intermediate_size"]),
            weight_stash=int(sizes["weight_stash_size"]),
            available=self.available_memory,
            flops=sizes["flops"],
            fingerprint=fingerprint,
        )


def _stage_time(q: Quantities) -> float:
    return q.times.get(ModuleKind.forward, math.inf) + q.times.get(ModuleKind.backward, math.inf)


def relative_error(estimate: float, measured: float) -> float:
    """|estimate - measured| / measured (inf when measured is not positive)."""
    if measured <= 0 or not math.isfinite(measured) or not math.isfinite(estimate):
        return math.inf
    return abs(estimate - measured) / measured
