"""Collective traffic counted from a compiled module's HLO text (`Compiled.as_text()`)."""

import re

COLLECTIVE_KINDS: tuple[str, ...] = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
)

# HLO element type -> bytes (sub-byte types rounded up to one byte).
HLO_DTYPE_BYTES: dict[str, int] = {
    "pred": 1,
    "s4": 1,
    "u4": 1,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3": 1,
    "f8e4m3b11fnuz": 1,
    "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}

_KIND_RE = "|".join(re.escape(k) for k in COLLECTIVE_KINDS)
# `%name = <result shape> <op>(` where op is a collective or its async `-done` half (whose
# result is the collective's output; the `-start` half is skipped so nothing counts twice).
_INSTR_RE = re.compile(
    rf"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.+?)\s+(?P<op>{_KIND_RE})(?:-done)?\(",
    re.MULTILINE,
)
_ARRAY_RE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")


def shape_bytes(shape_text: str) -> int:
    """Bytes of an HLO result shape, e.g. ``f32[4,16]{1,0}`` or a tuple of such."""
    total = 0
    for dtype, dims in _ARRAY_RE.findall(shape_text):
        if dtype not in HLO_DTYPE_BYTES:
            continue
        n = HLO_DTYPE_BYTES[dtype]
        for d in dims.split(","):
            if d:
                n *= int(d)
        total += n
    return total


def collective_bytes(hlo_text: str) -> dict[str, int]:
    """Bytes per device produced by each kind of collective in `hlo_text`.

    Returns ``{kind: bytes}`` for every kind in `COLLECTIVE_KINDS` (0 when absent). The result
    shape of an SPMD-partitioned module is per device, so the sum is bytes per device.
    """
    out = dict.fromkeys(COLLECTIVE_KINDS, 0)
    for m in _INSTR_RE.finditer(hlo_text):
        out[m.group("op")] += shape_bytes(m.group("shape"))
    return out
