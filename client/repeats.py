"""Find a model's blocks: maximal tandem repeats in a sequence of equation tokens.

A run of period P is a stretch where `tok[i] == tok[i + P]` throughout; it holds
`len // P` copies of a unit of P equations. The run that covers the most FLOPs wins (the
shortest period on a tie); its phase (where each unit starts) is chosen so that the most unit
boundaries fall on scope boundaries, then so that the fewest bytes cross them. Copies of the
unit separated only by zero-FLOP glue join the run. What precedes and follows it (and any
gap with FLOPs between its units) is searched again, for other kinds of blocks.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# A unit must hold at least this share of the model's FLOPs to be a block.
MIN_BLOCK_SHARE = 0.005
# How many periods (the best run of each) are tried, best first, before giving up.
_TRIES = 8
# At most this many candidate periods are measured (those seen most often).
_MAX_PERIODS = 512


@dataclass(frozen=True)
class Sequence_:
    """What the search reads, per equation `i` of the sequence (`m` equations)."""

    tok: np.ndarray  # (m,) structural tokens
    flops: np.ndarray  # (m,) forward FLOPs
    cut: np.ndarray  # (m+1,) bytes crossing a cut before i (inf: not allowed)
    scope_cut: np.ndarray  # (m+1,) bool: a cut before i falls on a scope boundary
    block_scope: np.ndarray  # (m,) bool: i opens one of the model's repeated scopes
    producers: Sequence[np.ndarray]  # per equation: the equations its inputs come from

    @property
    def prefix(self) -> np.ndarray:
        return np.concatenate([[0.0], np.cumsum(self.flops)])


def find_blocks(seq: Sequence_) -> list[tuple[int, int]]:
    """The blocks `(lo, hi)` of `seq`, in order, non-overlapping; [] when nothing repeats."""
    prefix = seq.prefix
    threshold = MIN_BLOCK_SHARE * float(prefix[-1])
    found: list[tuple[int, int]] = []
    _search(seq, prefix, 0, len(seq.tok), threshold, found)
    return sorted(found)


def _search(
    seq: Sequence_,
    prefix: np.ndarray,
    lo: int,
    hi: int,
    threshold: float,
    found: list[tuple[int, int]],
) -> None:
    if hi - lo < 2 or prefix[hi] - prefix[lo] < 2 * max(threshold, 1e-30):
        return
    for period, start, end in _runs(seq.tok, prefix, lo, hi, threshold):
        blocks = _phase(seq, start, end, period)
        if blocks is None or not _chained(seq, blocks):
            continue
        blocks = _extend(seq, prefix, blocks, lo, hi)
        offsets = _scope_offsets(seq, prefix, *blocks[0])
        if offsets is None:
            offsets = _similar_starts(seq, prefix, *blocks[0])
        for a, b in blocks:
            bounds = [a, *(a + c for c in offsets), b]
            found.extend(zip(bounds, bounds[1:], strict=False))
        _search(seq, prefix, lo, blocks[0][0], threshold, found)
        for (_, b), (a, _) in zip(blocks, blocks[1:], strict=False):
            _search(seq, prefix, b, a, threshold, found)
        _search(seq, prefix, blocks[-1][1], hi, threshold, found)
        return


def _runs(
    tok: np.ndarray, prefix: np.ndarray, lo: int, hi: int, threshold: float
) -> list[tuple[int, int, int]]:
    """The best run `(period, start, end)` of each candidate period in [lo, hi), best first."""
    t = tok[lo:hi]
    n = len(t)
    order = np.argsort(t, kind="stable")
    same = t[order[1:]] == t[order[:-1]]
    gaps = (order[1:] - order[:-1])[same]
    gaps = gaps[(gaps >= 1) & (gaps <= n // 2)]
    if not len(gaps):
        return []
    periods, counts = np.unique(gaps, return_counts=True)
    if len(periods) > _MAX_PERIODS:
        periods = periods[np.argsort(-counts, kind="stable")[:_MAX_PERIODS]]
    best: list[tuple[float, int, int, int]] = []
    for p in (int(x) for x in periods):
        match = t[:-p] == t[p:]
        edges = np.diff(np.concatenate([[0], match.view(np.int8), [0]]))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        long = ends - starts >= p
        if not long.any():
            continue
        s = starts[long] + lo
        e = ends[long] + p + lo
        count = (e - s) // p
        covered = prefix[s + count * p] - prefix[s]
        unit = covered / count
        covered = np.where(unit >= threshold, covered, -1.0)
        k = int(np.argmax(covered))
        if covered[k] > 0:
            best.append((-float(covered[k]), p, int(s[k]), int(e[k])))
    best.sort()
    return [(p, s, e) for _, p, s, e in best[:_TRIES]]


def _phase(seq: Sequence_, start: int, end: int, period: int) -> list[tuple[int, int]] | None:
    """The units of the run [start, end): the phase giving the most whole units, then the most
    boundaries on scope boundaries, then the fewest bytes crossing them, then the earliest."""
    best: tuple | None = None
    for r in range(period):
        count = (end - start - r) // period
        if count < 2:
            break
        cuts = start + r + period * np.arange(count + 1)
        cost = float(seq.cut[cuts].sum())
        if not np.isfinite(cost):
            continue
        score = (-count, -int(seq.scope_cut[cuts].sum()), cost, r)
        if best is None or score < best[0]:
            best = (score, [(int(a), int(a) + period) for a in cuts[:-1]])
    return None if best is None else best[1]


def _chained(seq: Sequence_, blocks: Sequence[tuple[int, int]]) -> bool:
    """Whether each unit reads something the one before it computed (blocks run in a chain;
    three projections of one input do not)."""
    for (a0, b0), (a1, b1) in zip(blocks, blocks[1:], strict=False):
        if not any(((p >= a0) & (p < b0)).any() for p in seq.producers[a1:b1]):
            return False
    return True


def _extend(
    seq: Sequence_, prefix: np.ndarray, blocks: list[tuple[int, int]], lo: int, hi: int
) -> list[tuple[int, int]]:
    """`blocks` and further copies of their unit before and after them, separated from them
    by zero-FLOP glue only."""
    a0, b0 = blocks[0]
    unit = seq.tok[a0:b0]
    p = b0 - a0
    after: list[tuple[int, int]] = []
    end = blocks[-1][1]
    j = end
    while j + p <= hi:
        if np.array_equal(seq.tok[j : j + p], unit) and _chained(seq, [(end - p, end), (j, j + p)]):
            after.append((j, j + p))
            end = j = j + p
        elif seq.flops[j] == 0:
            j += 1
        else:
            break
    before: list[tuple[int, int]] = []
    start = a0
    j = start - p
    while j >= lo:
        if prefix[start] - prefix[j + p] > 0:
            break
        if np.array_equal(seq.tok[j : j + p], unit) and _chained(
            seq, [(j, j + p), (start, start + p)]
        ):
            before.insert(0, (j, j + p))
            start = j
            j = start - p
        else:
            j -= 1
    return [*before, *blocks, *after]


def _scope_offsets(seq: Sequence_, prefix: np.ndarray, lo: int, hi: int) -> list[int] | None:
    """Where a unit holding several of the model's repeated scopes (blocks of two kinds
    taking turns) opens each: offsets from `lo`. [] when scopes say the unit is one block;
    None when they say nothing."""
    opens = [i for i in range(lo, hi) if seq.block_scope[i]]
    if not opens:
        return None
    cuts = [i for i in opens if i > lo and np.isfinite(seq.cut[i])]
    bounds = [lo, *cuts, hi]
    if any(prefix[b] - prefix[a] <= 0 for a, b in zip(bounds, bounds[1:], strict=False)):
        return []
    return [c - lo for c in cuts]


# A block start inside a unit: its first equations match the unit's own first ones over at
# least this share of the smaller piece's FLOPs (a dense and an MoE block both open with
# attention; a pre-norm block's MLP half shares only a norm with its attention half).
_SIMILAR_START = 0.25


def _similar_starts(seq: Sequence_, prefix: np.ndarray, lo: int, hi: int) -> list[int]:
    """Offsets inside an unscoped unit where another block starts (blocks of two or three
    kinds taking turns): where the equations run as the unit's first ones do, and no more
    bytes cross than at the unit's start. Split recursively (a unit A A B: A | A | B)."""
    p = hi - lo
    best, best_flops = 0, 0.0
    for c in range(1, p):
        if not seq.cut[lo + c] <= seq.cut[lo] * 1.001 + 1:
            continue
        same = seq.tok[lo : hi - c] == seq.tok[lo + c : hi]
        run = int(np.argmin(same)) if not same.all() else len(same)
        shared = prefix[lo + run] - prefix[lo]
        smaller = min(prefix[lo + c] - prefix[lo], prefix[hi] - prefix[lo + c])
        if smaller > 0 and shared >= _SIMILAR_START * smaller and shared > best_flops:
            best, best_flops = c, shared
    if not best:
        return []
    left = _similar_starts(seq, prefix, lo, lo + best)
    right = _similar_starts(seq, prefix, lo + best, hi)
    return [*left, best, *(best + c for c in right)]
