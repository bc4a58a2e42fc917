"""Layer profiles of one count of micro-batches estimated from those measured at other sizes.

A job that searches counts (`planner.microbatches`) runs every count at its own micro-batch
size s. A stage's numbers are close to affine in s: its FLOPs are linear, its activations,
stash and what its peak holds beyond parameters grow with s, parameter and optimizer bytes
do not, and its times are a per-call cost plus work that grows with s. So a layer profile
(a stage of one or two layers, `planner.estimate`) on one submesh and config is measured
only at the smallest and largest size that has that config (a config's data-parallel size
must divide the micro-batch size: small sizes have fewer configs), and at a size strictly
between two measured ones it is the straight line between them:

    q(s) = q(s0) + (s - s0) / (s1 - s0) x (q(s1) - q(s0)),   s0 < s < s1

for every module's time, the peak, the sizes and the FLOPs (a constant stays exact). The
weights lie in [0, 1]: never an extrapolation, never negative. Such a profile is an
ESTIMATE (`EstimateSearch.add_prior`): its stage is measured when a plan that could be best
rests on it, like every estimated stage.
"""

from collections.abc import Iterable, Mapping

from planner.candidates import CandidateSpace
from planner.estimate import SIZES, TIMED
from planner.estimate_result import estimated_result
from planner.table import Key
from schemas import ModuleKind, StageProfileResult

# (start, end, submesh, config as JSON): one stage of the model at any micro-batch size
Ident = tuple[int, int, int, str]


def stage_ident(space: CandidateSpace, key: Key) -> Ident:
    """What names `key`'s stage across counts (config ids differ between their spaces)."""
    _, config = space.resolve(key)
    return (key[0], key[1], key[2], config.model_dump_json())


def ident_index(space: CandidateSpace) -> dict[Ident, Key]:
    """Every candidate of `space` by its `stage_ident`."""
    configs = [[c.model_dump_json() for c in row] for row in space.configs]
    return {
        (k.start, k.end, k.submesh_id, configs[k.submesh_id][k.config_id]): k.as_tuple()
        for k in space.keys
    }


def inside(size: int, holders: Iterable[int]) -> bool:
    """Whether `size` lies strictly between two sizes of `holders` (the sizes that have the
    stage): then it is interpolated, and measured only at the smallest and the largest."""
    sizes = list(holders)
    return bool(sizes) and min(sizes) < size < max(sizes)


def bracket(size: int, measured: Iterable[int]) -> tuple[int, int] | None:
    """The nearest measured size below `size` and the nearest above; None without both."""
    sizes = set(measured)
    below = [s for s in sizes if s < size]
    above = [s for s in sizes if s > size]
    if not below or not above:
        return None
    return max(below), min(above)


def interpolate(
    lo: StageProfileResult,
    lo_size: int,
    hi: StageProfileResult,
    hi_size: int,
    size: int,
    fingerprint: str = "",
) -> StageProfileResult:
    """The stage at micro-batch `size` on the straight line between its measurements at
    `lo_size` and `hi_size` (both ok, `lo_size < size < hi_size`; see the module doc): an
    estimate, status ok, its modules those both measured."""
    if not lo.ok or not hi.ok:
        raise ValueError("interpolating from a failed measurement")
    if not lo_size < size < hi_size:
        raise ValueError(f"size {size} is not between {lo_size} and {hi_size}")
    if lo.config != hi.config or lo.submesh != hi.submesh or lo.num_layers != hi.num_layers:
        raise ValueError("interpolating between two different stages")
    w = (size - lo_size) / (hi_size - lo_size)

    def line(a: float, b: float) -> float:
        return (1.0 - w) * a + w * b

    times: dict[ModuleKind, float] = {}
    for kind in TIMED:
        a, b = lo.module(kind), hi.module(kind)
        if a is not None and b is not None:
            times[kind] = line(a.compute_cost, b.compute_cost)
    sizes = {name: line(float(getattr(lo, name)), float(getattr(hi, name))) for name in SIZES}
    return estimated_result(
        lo.submesh,
        lo.config,
        lo.num_layers,
        times,
        peak=round(line(lo.peak_memory, hi.peak_memory)),
        initial=round(sizes["initial_var_size"]),
        intermediate=round(sizes["intermediate_size"]),
        weight_stash=round(sizes["weight_stash_size"]),
        available=lo.available_memory,
        flops=sizes["flops"],
        fingerprint=fingerprint,
    )


def interpolated_profile(
    ident: Ident,
    size: int,
    measured: Mapping[int, Mapping[Ident, StageProfileResult]],
    fingerprint: str = "",
) -> StageProfileResult | None:
    """The stage `ident` at `size` from the ok measurements of it at other sizes
    (`measured[size][ident]`), between the nearest below and above; None without both."""
    have = {s for s, by_ident in measured.items() if s != size and _ok(by_ident.get(ident))}
    ends = bracket(size, have)
    if ends is None:
        return None
    lo, hi = ends
    return interpolate(measured[lo][ident], lo, measured[hi][ident], hi, size, fingerprint)


def _ok(result: StageProfileResult | None) -> bool:
    return result is not None and result.ok
