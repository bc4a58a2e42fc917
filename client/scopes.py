"""Which named scopes become layers: the user's top-level markers, or a model's repeated
child modules (a Flax model's transformer blocks), found in the equations' scope paths."""

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax.extend import core

ScopePath = tuple[str, ...]

# A name that ends in an index: `h_0`, `layers_3`, `block12`, NNX's `layers/0`, `0`.
_INDEXED = re.compile(r"^(.*?)(\d+)$")
# Params naming one sub-program that runs once per call (jit, remat, custom_jvp/vjp, scan).
_BODY_PARAMS = ("jaxpr", "call_jaxpr")


def _own_scopes(eqn: Any) -> ScopePath:
    return tuple(
        str(item.name)
        for item in eqn.source_info.name_stack.stack
        if type(item).__name__ == "Scope" and getattr(item, "name", None)
    )


def _body(eqn: Any) -> Any:
    for key in _BODY_PARAMS:
        body = eqn.params.get(key)
        if isinstance(body, core.ClosedJaxpr):
            return body.jaxpr
        if isinstance(body, core.Jaxpr):
            return body
    return None


def common_prefix(paths: Sequence[ScopePath]) -> ScopePath:
    """The longest scope path every one of `paths` starts with."""
    if not paths:
        return ()
    first = paths[0]
    n = min(len(p) for p in paths)
    for i in range(n):
        if any(p[i] != first[i] for p in paths):
            return first[:i]
    return first[:n]


def scope_paths(eqns: Sequence[Any]) -> list[ScopePath]:
    """Each equation's named-scope path, outermost first.

    A call whose body runs entirely under deeper scopes (e.g. `nn.remat(Block)`: a remat
    equation at `GPT` whose body is all under `h_0`) gets them appended: `("GPT", "h_0")`.
    """
    cache: dict[int, ScopePath] = {}

    def path(eqn: Any) -> ScopePath:
        own = _own_scopes(eqn)
        body = _body(eqn)
        if body is None:
            return own
        if id(body) not in cache:
            cache[id(body)] = common_prefix([path(e) for e in body.eqns])
        return own + cache[id(body)]

    return [path(e) for e in eqns]


@dataclass(frozen=True)
class Level:
    """Layers are the scopes `depth` levels down; `blocks` limits them to these paths
    (None: every scope at that depth). Everything else is cut by its top-level scope."""

    depth: int
    blocks: frozenset[ScopePath] | None = None

    def key(self, path: ScopePath) -> ScopePath:
        """The layer an equation belongs to: its scope at `depth` or its top-level one."""
        head = path[: self.depth]
        if len(head) == self.depth and (self.blocks is None or head in self.blocks):
            return head
        return path[:1]


def repeated_scopes(paths: Sequence[ScopePath], depth: int) -> set[ScopePath]:
    """Scopes at `depth` in a run of >= 2 consecutive siblings whose names differ only in a
    trailing index (`h_0, h_1`, `layers/0, layers/1`)."""
    seq: list[ScopePath] = []
    for p in paths:
        if len(p) >= depth and (not seq or seq[-1] != p[:depth]):
            seq.append(p[:depth])
    found: set[ScopePath] = set()
    for a, b in zip(seq, seq[1:], strict=False):
        ma, mb = _INDEXED.match(a[-1]), _INDEXED.match(b[-1])
        if a[:-1] == b[:-1] and ma and mb and ma.group(1) == mb.group(1) and a[-1] != b[-1]:
            found.update((a, b))
    return found


def _glob(pattern: str) -> re.Pattern[str]:
    """`*` and `?` stay within one scope name; the pattern may match the path's tail."""
    body = "".join(
        "[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in pattern.strip("/")
    )
    return re.compile(rf"(?:^|.*/){body}")


def choose_level(
    paths: Sequence[ScopePath], flops: Sequence[float], scopes: str | int | None
) -> Level:
    """The scope level that becomes layers.

    `scopes=None`: the level whose repeated sibling scopes (see `repeated_scopes`) hold the
    most FLOPs, the shallowest on a tie; those scopes are the layers. With none, every
    top-level scope is a layer. An int: every scope that many levels down. A glob pattern
    (`"h_*"`, `"transformer/h_*"`; `*` stays within a name, the pattern may match the end of
    a path): the matching scopes at the shallowest level where any matches.
    """
    deepest = max((len(p) for p in paths), default=0)
    if scopes is None:
        best, best_flops = Level(1), 0.0
        for depth in range(1, deepest + 1):
            blocks = repeated_scopes(paths, depth)
            total = sum(f for p, f in zip(paths, flops, strict=True) if p[:depth] in blocks)
            if blocks and (total > best_flops or best.blocks is None):
                best, best_flops = Level(depth, frozenset(blocks)), total
        return best
    if isinstance(scopes, bool) or not isinstance(scopes, int | str):
        raise ValueError(f"scopes must be a glob pattern, a depth or None, got {scopes!r}")
    if isinstance(scopes, int):
        if scopes < 1:
            raise ValueError(f"scopes (a depth) must be >= 1, got {scopes}")
        if scopes > max(deepest, 1):
            raise ValueError(f"scopes={scopes}: no scope is that deep (deepest: {deepest})")
        return Level(scopes)
    pattern = _glob(scopes)
    for depth in range(1, deepest + 1):
        blocks = {p[:depth] for p in paths if len(p) >= depth}
        matched = frozenset(b for b in blocks if pattern.fullmatch("/".join(b)))
        if matched:
            return Level(depth, matched)
    shown = sorted({"/".join(p[:3]) for p in paths if p})[:12]
    raise ValueError(f"scopes={scopes!r} matches no scope; scopes seen: {shown}")


def level_segments(paths: Sequence[ScopePath], level: Level) -> list[tuple[str, int, int]]:
    """Cut equations into contiguous `(name, lo, hi)` layers at `level`.

    Unscoped equations join the layer before them (or the first when they lead). Layers are
    named by their scope path below the top level (`h_0`, `layers/0`; the whole path when
    blocks lie under several top-level scopes); the rest by the first module in them
    (`wte`). A name that comes back after another layer is `name.1`, `name.2`, ...
    """
    runs: list[tuple[ScopePath, int]] = []
    for i, p in enumerate(paths):
        key = level.key(p)
        if key and (not runs or runs[-1][0] != key):
            runs.append((key, i))
    if not runs:
        return [("layer0", 0, len(paths))]
    bounds = [0] + [lo for _, lo in runs[1:]] + [len(paths)]
    # Blocks under several top-level scopes (two models called): names keep the top level.
    skip = 1 if len({key[0] for key, _ in runs if len(key) > 1}) <= 1 else 0
    segments: list[tuple[str, int, int]] = []
    seen: dict[str, int] = {}
    for (key, _), lo, hi in zip(runs, bounds, bounds[1:], strict=False):
        name = _segment_name(key, paths[lo:hi], level.depth, skip)
        count = seen.get(name, 0)
        seen[name] = count + 1
        segments.append((name if count == 0 else f"{name}.{count}", lo, hi))
    return segments


def _segment_name(key: ScopePath, paths: Sequence[ScopePath], depth: int, skip: int) -> str:
    if len(key) > 1:
        # A bare index (a scan's iteration `blocks/3` at the top level) keeps its parent.
        return "/".join(key[skip - int(key[-1].isdigit() and len(key) - skip == 1) :])
    for p in paths:
        if p[:1] == key and len(p) > 1 and depth > 1:
            return "/".join(p[skip:depth])
    return key[0]


def inside_scopes(paths: Sequence[ScopePath], depth: int) -> np.ndarray:
    """inside[p], p in 0..n: whether a cut before equation p would split a scope at `depth`
    (equations p-1 and p under the same such scope, unscoped ones between them included)."""
    inside = np.zeros(len(paths) + 1, dtype=bool)
    current: ScopePath | None = None
    last = 0
    for i, p in enumerate(paths):
        if len(p) < depth:
            continue
        if p[:depth] == current:
            inside[last + 1 : i + 1] = True
        current, last = p[:depth], i
    return inside
