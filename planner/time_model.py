"""A stage's module time as a per-call overhead plus its layers' marginal times.

On one submesh and config, a module (forward, backward, ...) of layers a..b takes

    t(a..b) = o + Σ_{k=a..b} μ[class(k)]

where layers of equal fingerprint share a class (identical blocks cost the same) and `o` is
what one call of a compiled program costs beyond its layers. The unknowns are fitted to
the measured stages given (`planner.estimate` gives a submesh and config's layer profiles,
its one- and two-layer stages; longer stages correct its estimates through a length law,
not through this fit) by least squares on relative error, with no negative coefficient (an
active set: a coefficient fitted negative is fixed at zero and the rest refitted). One and
two layer stages alone determine it, and the fit never amplifies the noise of a single pair
the way a pairwise difference does; a layer profile timed slow stays in every estimate
made from it.
"""

from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import NDArray


def class_counts(
    classes: Sequence[int], start: int, end: int, num_classes: int
) -> NDArray[np.float64]:
    """How many layers of each class the range start..end holds."""
    return np.bincount(np.asarray(classes[start : end + 1]), minlength=num_classes).astype(
        np.float64
    )


def fit(
    rows: Iterable[tuple[int, int, float]], classes: Sequence[int], num_classes: int
) -> NDArray[np.float64] | None:
    """`[o, μ_0, ..., μ_{n-1}]` from measured `(start, end, seconds)`; NaN for a class no
    measured stage holds; None when nothing was measured."""
    data = [(a, b, t) for a, b, t in rows if t > 0 and np.isfinite(t)]
    if not data:
        return None
    x = np.array([[1.0, *class_counts(classes, a, b, num_classes)] for a, b, _ in data])
    y = np.array([t for _, _, t in data])
    x, y = x / y[:, None], np.ones_like(y)  # relative error: each row divided by its time
    seen = np.flatnonzero(x[:, 1:].sum(axis=0) > 0) + 1
    active = [0, *seen.tolist()]
    coef = np.zeros(num_classes + 1)
    for _ in range(num_classes + 2):
        sol, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        negative = [j for j, v in zip(active, sol, strict=True) if v < 0]
        active = [j for j in active if j not in negative]
        if not active:
            break
    unseen = np.ones(num_classes + 1, dtype=bool)
    unseen[[0, *seen.tolist()]] = False
    coef[unseen] = np.nan
    return coef


def predict(coef: NDArray[np.float64], classes: Sequence[int], start: int, end: int) -> float:
    """The fitted time of start..end; NaN when it holds a class never measured."""
    counts = class_counts(classes, start, end, len(coef) - 1)
    mu = coef[1:]
    if np.isnan(mu[counts > 0]).any():
        return float("nan")
    return float(coef[0] + counts[counts > 0] @ mu[counts > 0])


def spans_layers(rows: Iterable[tuple[int, int, float]]) -> bool:
    """Whether some measured stage holds more than one layer: only then does the fit tell
    the per-call overhead from the layers' times."""
    return any(b > a for a, b, t in rows if t > 0 and np.isfinite(t))


def fit_singles(
    rows: Iterable[tuple[int, int, float]],
    classes: Sequence[int],
    num_classes: int,
    reference: NDArray[np.float64],
) -> NDArray[np.float64] | None:
    """`[o, μ...]` from one-layer stages only, given `reference`, a fit on another submesh
    or config that measured longer stages. The overhead is the larger of the reference's
    and its share of each layer's time there applied to the time here (at most the fastest
    layer's time): a larger overhead only lowers the estimate of a longer stage, so the
    guess errs towards the optimistic bound a search verifies. None when no measured class
    is in the reference."""
    times: dict[int, list[float]] = {}
    for a, b, t in rows:
        if a == b and t > 0 and np.isfinite(t):
            times.setdefault(classes[a], []).append(t)
    own = {k: float(np.median(v)) for k, v in times.items()}
    o_ref = reference[0]
    shares = [
        o_ref / (o_ref + reference[1 + k]) * t
        for k, t in own.items()
        if np.isfinite(reference[1 + k]) and o_ref + reference[1 + k] > 0
    ]
    if not shares or not np.isfinite(o_ref):
        return None
    overhead = min(max(float(o_ref), float(np.mean(shares))), min(own.values()))
    coef = np.full(num_classes + 1, np.nan)
    coef[0] = overhead
    for k, t in own.items():
        coef[1 + k] = t - overhead
    return coef
