"""Layers from the computation's structure: the model's blocks are its repeated, structurally
identical stretches of equations (`client.repeats`), whatever library wrote them; what runs
before the first block and after the last are layers of their own.

Equations that read neither parameters nor anything computed from them ("free": masks, index
tables, `head_mask[i]`) match by primitive and shapes only, and those that differ from block
to block (a slice at each block's own index) move to the front, so equal blocks stay equal.
A stretch between blocks, or before or after them, with no FLOPs and no parameters joins a
neighbour.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax.extend import core

from client.clustering import cluster_segments, cut_bytes
from client.layers import remakeable
from client.repeats import Sequence_, find_blocks
from client.scopes import ScopePath, choose_level, common_prefix
from client.tokens import Tokenizer


@dataclass(frozen=True)
class Layering:
    """`order`: the equations' indices in the order the layers take them; `segments`:
    `(lo, hi, is_block)` ranges of that order, one per layer."""

    order: list[int]
    segments: list[tuple[int, int, bool]]
    keys: list[ScopePath]  # each equation's scope at the model's block level (reordered)
    block_scopes: frozenset[ScopePath]  # the model's repeated scopes
    reads_param: np.ndarray  # (reordered) whether each equation reads a parameter
    cut: np.ndarray  # (reordered, n+1) bytes crossing a cut before each equation


def structural_layers(
    eqns: Sequence[Any],
    outvars: Sequence[Any],
    is_param: Callable[[Any], bool],
    flops: Sequence[float],
    paths: Sequence[ScopePath],
    can_cross: Callable[[Any], bool],
) -> Layering | None:
    """The layers of `eqns` by structure, or None when no block repeats."""
    n = len(eqns)
    made = {v: e for e in eqns for v in e.outvars}

    def passable(v: Any) -> bool:  # crosses a cut, or is made again after it (`localize`)
        return can_cross(v) or remakeable(v, made, can_cross)

    producer: dict[Any, int] = {}
    free = np.zeros(n, dtype=bool)
    producers: list[np.ndarray] = []
    reads_param = np.zeros(n, dtype=bool)
    for i, eqn in enumerate(eqns):
        ins = [v for v in eqn.invars if isinstance(v, core.Var)]
        src = [producer[v] for v in ins if v in producer]
        producers.append(np.asarray(src, dtype=np.int64))
        reads_param[i] = any(is_param(v) for v in ins)
        free[i] = (
            not eqn.effects
            and not reads_param[i]
            and all(free[j] for j in src)
            and all(can_cross(v) for v in eqn.outvars if not isinstance(v, core.DropVar))
        )
        for v in eqn.outvars:
            producer[v] = i
    tokenizer = Tokenizer()
    tok = tokenizer.tokens(eqns, weak=free)
    cut = cut_bytes(eqns, outvars, passable)
    flops_arr = np.asarray(flops, dtype=np.float64)
    level = choose_level(paths, flops, None)
    keys = [level.key(p) for p in paths]
    scope_cut = np.ones(n + 1, dtype=bool)
    scope_cut[1:n] = [a != b for a, b in zip(keys, keys[1:], strict=False)]
    blocks_at = level.blocks or frozenset()
    block_scope = np.array([k in blocks_at for k in keys], dtype=bool) & scope_cut[:n]
    seq = Sequence_(tok, flops_arr, cut, scope_cut, block_scope, producers)
    blocks = find_blocks(seq)
    if not blocks:
        return None
    hoisted = _differing_free(eqns, blocks, tok, free, producers, tokenizer)
    order = [i for i in range(n) if hoisted[i]] + [i for i in range(n) if not hoisted[i]]
    before = np.concatenate([[0], np.cumsum(hoisted)])  # hoisted equations before i

    def moved(i: int) -> int:
        return int(hoisted.sum()) + i - int(before[i])

    new_blocks = [(moved(a), moved(b) if b < n else n) for a, b in blocks]
    new_eqns = [eqns[i] for i in order]
    new_cut = cut_bytes(new_eqns, outvars, passable)
    weight = flops_arr[order]
    params_at = reads_param[order]
    # Outside the blocks, a repeated scope that opens or closes still cuts (a first block
    # that differs from the others a little, e.g. in the layout it reads its input in).
    new_keys = [keys[i] for i in order]
    edges = np.zeros(n + 1, dtype=bool)
    for i in range(1, n):
        a, b = new_keys[i - 1], new_keys[i]
        edges[i] = a != b and (a in blocks_at or b in blocks_at)
    view = _View(tok[order], weight, params_at, new_cut, edges, new_keys, blocks_at)
    pieces = _segments(new_blocks, view)
    return Layering(order, pieces, new_keys, blocks_at, params_at, new_cut)


def _differing_free(
    eqns: Sequence[Any],
    blocks: Sequence[tuple[int, int]],
    tok: np.ndarray,
    free: np.ndarray,
    producers: Sequence[np.ndarray],
    tokenizer: Tokenizer,
) -> np.ndarray:
    """Free equations that differ between blocks of one kind (with the free equations they
    read): they move to the front."""
    kinds: dict[tuple, list[int]] = {}
    for a, b in blocks:
        kinds.setdefault(tuple(tok[a:b]), []).append(a)
    hoist = np.zeros(len(eqns), dtype=bool)
    for unit, starts in kinds.items():
        if len(starts) < 2:
            continue
        for off in range(len(unit)):
            if not free[starts[0] + off]:
                continue
            strong = {tokenizer.token(eqns[a + off]) for a in starts}
            if len(strong) > 1:
                hoist[[a + off for a in starts]] = True
    for i in range(len(eqns) - 1, -1, -1):
        if hoist[i]:
            hoist[producers[i]] = True
    return hoist


@dataclass(frozen=True)
class _View:
    """The reordered equations, as `_segments` reads them."""

    tok: np.ndarray
    flops: np.ndarray
    reads_param: np.ndarray
    cut: np.ndarray  # (n+1,) bytes crossing a cut before each equation
    edges: np.ndarray  # (n+1,) a repeated scope opens or closes before each equation
    keys: list[ScopePath]  # each equation's scope at the block level
    block_scopes: frozenset[ScopePath]


def _segments(blocks: Sequence[tuple[int, int]], view: _View) -> list[tuple[int, int, bool]]:
    """Blocks and the stretches around them as layers. A stretch is cut where a repeated
    scope opens or closes around a piece that runs as a block does over most of its FLOPs
    (a first block that reads its input in another layout) or, before the last block, one
    that is block-sized and all in one repeated scope (a ResNet stage's first block); a
    stretch whose equations all
    sit in the scope of the block beside it joins that block (the loss inside a user's last
    marker); one with neither FLOPs nor parameters joins a neighbour (between two blocks:
    where fewer bytes cross)."""
    n = len(view.tok)
    prefix = np.concatenate([[0.0], np.cumsum(view.flops)])
    units = {tuple(view.tok[a:b]) for a, b in blocks}
    smallest = min(prefix[b] - prefix[a] for a, b in blocks)

    def block_like(a: int, b: int) -> bool:
        if prefix[b] - prefix[a] < 0.5 * smallest:
            return False
        piece = view.tok[a:b]
        best = 0.0
        for unit in units:
            m = min(len(unit), len(piece))
            head = np.asarray(unit[:m]) == piece[:m]
            tail = np.asarray(unit[-m:]) == piece[-m:]
            lp = int(np.argmin(head)) if not head.all() else m
            ls = int(np.argmin(tail[::-1])) if not tail.all() else m
            best = max(best, prefix[a + lp] - prefix[a], prefix[b] - prefix[b - ls])
        return best > 0 and best >= 0.5 * (prefix[b] - prefix[a])

    def marked(a: int, b: int) -> bool:
        """A block-sized piece all in one repeated scope (a stage's first block)."""
        keys = {view.keys[i] for i in range(a, b) if view.flops[i] or view.reads_param[i]}
        return (
            len(keys) == 1
            and keys <= view.block_scopes
            and prefix[b] - prefix[a] >= 0.25 * smallest
        )

    pieces: list[tuple[int, int, bool]] = []

    def other(lo: int, hi: int, last: bool) -> None:
        bounds = [lo, *(i for i in range(lo + 1, hi) if view.edges[i] and np.isfinite(view.cut[i]))]
        bounds.append(hi)
        start = lo
        for a, b in zip(bounds, bounds[1:], strict=False):
            if block_like(a, b) or (not last and marked(a, b)):
                if a > start:
                    pieces.append((start, a, False))
                pieces.append((a, b, False))
                start = b
        if hi > start:
            pieces.append((start, hi, False))

    last = 0
    for a, b in blocks:
        if a > last:
            other(last, a, False)
        pieces.append((a, b, True))
        last = b
    if last < n:
        other(last, n, True)

    def empty(lo: int, hi: int) -> bool:
        return not view.flops[lo:hi].any() and not view.reads_param[lo:hi].any()

    def owned_by(lo: int, hi: int, block: tuple[int, int, bool]) -> bool:
        """Whether every equation of [lo, hi) with FLOPs or parameters sits in the block's
        repeated scope."""
        held = {k for k in view.keys[block[0] : block[1]] if k in view.block_scopes}
        if len(held) != 1:
            return False
        (key,) = held
        return all(
            view.keys[i] == key for i in range(lo, hi) if view.flops[i] or view.reads_param[i]
        )

    out: list[tuple[int, int, bool]] = []
    k = 0
    while k < len(pieces):
        lo, hi, is_block = pieces[k]
        after = pieces[k + 1] if k + 1 < len(pieces) else None
        if is_block:
            out.append((lo, hi, is_block))
        elif out and out[-1][2] and owned_by(lo, hi, out[-1]):
            out[-1] = (out[-1][0], hi, True)
        elif after is not None and after[2] and owned_by(lo, hi, after):
            pieces[k + 1] = (lo, after[1], True)
        elif not empty(lo, hi):
            out.append((lo, hi, is_block))
        elif not out:  # leading glue: into the next layer
            assert after is not None
            pieces[k + 1] = (lo, after[1], after[2])
        elif after is None or view.cut[hi] <= view.cut[lo]:  # into the layer before
            out[-1] = (out[-1][0], hi, out[-1][2])
        else:
            pieces[k + 1] = (lo, after[1], after[2])
        k += 1
    return out


def segment_names(
    paths: Sequence[ScopePath], flops: Sequence[float], layering: Layering
) -> list[str]:
    """A name per layer from its equations' scopes: a block by the scope all its equations
    share, down to the model's block level (`h_3`, `layers/2`), if those hold most of its
    FLOPs, else `block<k>`; another
    layer by the scope of its first equation that reads a parameter (`wte`, `ln_f`), or of
    one of the model's repeated scopes it holds, else `pre` / `post`. The outermost scope is
    left out when all the scoped equations share it (the model's own), unless a bare index
    would be left."""
    scoped = [p for p in paths if p]
    skip = 1 if len({p[0] for p in scoped}) == 1 and any(len(p) > 1 for p in scoped) else 0
    depth = max((len(k) for k in layering.block_scopes), default=1)
    names: list[str] = []
    blocks = 0
    for lo, hi, is_block in layering.segments:
        inside = [p for p in paths[lo:hi] if p]
        scoped_flops = sum(f for p, f in zip(paths[lo:hi], flops[lo:hi], strict=True) if p)
        if 2 * scoped_flops < sum(flops[lo:hi]):  # scopes inside (an einsum's), not around
            inside = []
        held = [k for k in layering.keys[lo:hi] if k in layering.block_scopes]
        if is_block:
            common = common_prefix(inside)
            digits = [k for k, part in enumerate(common) if part.isdigit()]
            if digits:  # a scan's iteration, `layers/3`: not the module inside it
                common = common[: digits[-1] + 1]
            if held and len(held[0]) >= len(common):
                common = held[0]
            name = _strip(common, skip) or f"block{blocks}"
            blocks += 1
        else:
            named = [
                p for p, r in zip(paths[lo:hi], layering.reads_param[lo:hi], strict=True) if p and r
            ]
            if held:
                name = _strip(held[0], skip)
            elif named or inside:
                first = (named or inside)[0]
                name = _strip(first[: max(skip + 1, min(len(first), depth))], skip)
            else:
                name = ""
            name = name or ("pre" if not names else "post")
        names.append(name)
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        count = seen.get(name, 0)
        seen[name] = count + 1
        unique.append(name if count == 0 else f"{name}.{count}")
    return unique


def _strip(path: ScopePath, skip: int) -> str:
    parts = path[skip:]
    if skip and len(parts) == 1 and parts[0].isdigit():  # a scan's `blocks/3` keeps `blocks`
        parts = path[skip - 1 :]
    return "/".join(parts)


def group_layers(
    segments: Sequence[tuple[int, int, bool]],
    flops: Sequence[float],
    cut: np.ndarray,
    names: Sequence[str],
    num_layers: int,
) -> list[tuple[str, int, int]]:
    """`layers=N`: the structural layers grouped into N runs of whole layers (blocks are never
    split), balancing FLOPs while few bytes cross the cuts (`client.clustering`)."""
    count = len(segments)
    blocks = sum(1 for *_, is_block in segments if is_block)
    if not 1 <= num_layers <= count:
        raise ValueError(
            f"layers={num_layers}: this model is {count} layers by its structure ({blocks} "
            f"blocks and {count - blocks} other layers: {', '.join(names)}) and layers=N "
            f"groups whole ones; pass layers between 1 and {count}, or leave it out"
        )
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(flops, dtype=np.float64))])
    weights = [max(float(prefix[hi] - prefix[lo]), 1.0) for lo, hi, _ in segments]
    bounds = [lo for lo, _, _ in segments] + [segments[-1][1]]
    groups = cluster_segments(weights, np.asarray([cut[b] for b in bounds]), num_layers)
    return [(name, bounds[lo], bounds[hi]) for name, lo, hi in groups]
