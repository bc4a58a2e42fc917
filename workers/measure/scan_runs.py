"""Runs of identical consecutive layers in a stage, which can be compiled as one `lax.scan`.

A *run* is k >= 2 consecutive layers of a stage with equal layer fingerprints, parameters of
equal shapes, dtypes, logical axes and sharding (under the stage's config), and the same
wiring: every output of layer j feeds layer j+1 at the same input positions (the *carry*,
floating and differentiated), every other input is the same var for all k (a *broadcast*,
e.g. MaxText's positions), and the outputs of all but the last layer are read by nobody
else. The vars their backwards read (`saved`) follow one pattern, and what the scan would
stack of them is stashed by no other layer of the stage, so the scanned stage keeps exactly
the unrolled stage's stash. `find_runs` is pure (no devices): the stage fingerprint
(`workers.measure.fingerprint`) and the composition (`workers.measure.compose_scan`) agree.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from schemas import FLOAT_DTYPES, LayerSpec, ModelSpec, ParamSpec, ShardingConfig
from schemas.settings import env_settings
from workers.measure.layer_keys import layer_key
from workers.measure.sharding import config_param_specs

MIN_RUN = 2


@dataclass(frozen=True)
class Run:
    """Layers `first .. first + length - 1` (spec indices) as one scan.

    `carry`: (input position, output position feeding it) pairs, one per output, in output
    order; `saved`: for each name in the layers' `saved` lists, ("bcast" | "in" | "out", its
    input or output position); "in"/"out" ones are stacked per iteration."""

    first: int
    length: int
    carry: tuple[tuple[int, int], ...]
    saved: tuple[tuple[str, int], ...]

    @property
    def last(self) -> int:
        return self.first + self.length - 1

    @property
    def carried_inputs(self) -> frozenset[int]:
        return frozenset(p for p, _ in self.carry)

    @property
    def out_from_next(self) -> bool:
        """Whether the layers save both a carried input and the output feeding it: the scan
        then stacks the inputs only, and a layer's saved output is the next one's input (the
        last one's, the run's output, is stashed once), as the unrolled stash keeps each once."""
        return {"in", "out"} <= {kind for kind, _ in self.saved}

    def stacks(self, kind: str) -> bool:
        """Whether saved vars of this kind are stacked per iteration."""
        return kind == "in" or (kind == "out" and not self.out_from_next)


def scan_stages_enabled(split_backward: bool) -> bool:
    """Whether a stage is measured with its runs scanned: `STAGEPROF_SCAN_STAGES` on, and no
    backward split (B and W are composed unrolled only)."""
    return env_settings().scan_stages and not split_backward


def _carry_map(prev: LayerSpec, cur: LayerSpec) -> tuple[tuple[int, int], ...] | None:
    """(input position of `cur`, output position of `prev`) for each output of `prev`, in
    output order, or None when `prev`'s outputs do not each feed exactly one input."""
    out_pos = {v.name: q for q, v in enumerate(prev.outputs)}
    pairs = sorted((out_pos[v.name], p) for p, v in enumerate(cur.inputs) if v.name in out_pos)
    if [q for q, _ in pairs] != list(range(len(prev.outputs))):
        return None
    return tuple((p, q) for q, p in pairs)


def _saved_pattern(layer: LayerSpec, carried: frozenset[int]) -> tuple[tuple[str, int], ...]:
    ins = {v.name: p for p, v in enumerate(layer.inputs)}
    outs = {v.name: q for q, v in enumerate(layer.outputs)}
    pattern = []
    for n in layer.saved:
        if n in ins:
            pattern.append(("in" if ins[n] in carried else "bcast", ins[n]))
        else:
            pattern.append(("out", outs[n]))
    return tuple(pattern)


def _same_body(a: LayerSpec, b: LayerSpec, key_a: str, key_b: str) -> bool:
    def sig(layer: LayerSpec) -> tuple:
        return (
            [(p.shape, p.dtype, p.logical_axes) for p in layer.params],
            [(v.shape, v.dtype) for v in [*layer.inputs, *layer.outputs, *layer.residuals]],
        )

    return key_a == key_b and sig(a) == sig(b)


def _param_specs(spec: ModelSpec, start: int, end: int, config: ShardingConfig) -> dict[str, str]:
    """Each stage parameter's PartitionSpec under `config`, as text (the rule functions of
    `workers.measure.sharding` need no mesh)."""
    params: dict[str, ParamSpec] = {}
    for layer in spec.layers[start : end + 1]:
        for p in layer.params:
            params.setdefault(p.name, p)
    specs = config_param_specs(config, list(params.values()))
    return {n: str(s) for n, s in zip(params, specs, strict=True)}


def find_runs(
    spec: ModelSpec, start: int, end: int, config: ShardingConfig, min_length: int = MIN_RUN
) -> list[Run]:
    """The maximal runs (see the module doc) among layers start..end, in order."""
    layers = spec.layers
    keys = {i: layer_key(layers[i]) for i in range(start, end + 1)}
    readers: dict[str, list[int]] = {}
    for i, layer in enumerate(layers):
        for v in layer.inputs:
            readers.setdefault(v.name, []).append(i)
    shard = _param_specs(spec, start, end, config)
    param_users: dict[str, int] = {}
    for layer in layers[start : end + 1]:
        for p in layer.params:
            param_users[p.name] = param_users.get(p.name, 0) + 1

    def joins(i: int, carry: tuple[tuple[int, int], ...] | None) -> bool:
        """Whether layer i continues a run whose previous layer is i - 1."""
        prev, cur, first = layers[i - 1], layers[i], layers[i - 1]
        if carry is None or not _same_body(first, cur, keys[i - 1], keys[i]):
            return False
        if any(readers.get(v.name) != [i] or v.name == spec.loss for v in prev.outputs):
            return False
        carried = {p for p, _ in carry}
        bcast_prev = [v.name for p, v in enumerate(prev.inputs) if p not in carried]
        bcast_cur = [v.name for p, v in enumerate(cur.inputs) if p not in carried]
        shards_equal = [shard[a.name] for a in prev.params] == [shard[b.name] for b in cur.params]
        return bcast_prev == bcast_cur and shards_equal

    runs: list[Run] = []
    i = start
    while i < end:
        carry = _carry_map(layers[i], layers[i + 1])
        j = i + 1
        while j <= end and joins(j, carry) and _carry_map(layers[j - 1], layers[j]) == carry:
            j += 1
        run = _checked(layers, i, j - i, carry, param_users) if j - i >= min_length else None
        if run is not None:
            runs.append(run)
        i = j if run is not None else i + 1
    return _without_stash_conflicts(layers, start, end, runs)


def _checked(
    layers: Sequence[LayerSpec],
    first: int,
    length: int,
    carry: tuple[tuple[int, int], ...] | None,
    param_users: dict[str, int],
) -> Run | None:
    """The run, or None when its carry, differentiation, saved pattern or parameters do not
    allow one scan."""
    if carry is None:
        return None
    body = layers[first : first + length]
    carried = frozenset(p for p, _ in carry)
    patterns = {_saved_pattern(layer, carried) for layer in body}
    if len(patterns) != 1:
        return None
    (saved,) = patterns
    saved_in = {pos for kind, pos in saved if kind == "in"}
    input_of = {q: p for p, q in carry}
    if saved_in and any(kind == "out" and input_of[q] not in saved_in for kind, q in saved):
        return None  # the carried vars would be stacked twice
    for layer in body:
        if any(layer.inputs[p].dtype not in FLOAT_DTYPES for p in carried):
            return None
        if not {layer.inputs[p].name for p in carried} <= set(layer.grad_inputs):
            return None
        if any(param_users[p.name] != 1 for p in layer.params):
            return None  # a parameter shared with another layer cannot be stacked
    return Run(first=first, length=length, carry=carry, saved=saved)


def stacked_saved_names(layers: Sequence[LayerSpec], run: Run) -> set[str]:
    """The vars a run's scan stacks for its backwards (its layers' saved carried vars)."""
    names = set()
    for layer in layers[run.first : run.last + 1]:
        for kind, pos in run.saved:
            if run.stacks(kind):
                names.add((layer.inputs if kind == "in" else layer.outputs)[pos].name)
    return names


def _without_stash_conflicts(
    layers: Sequence[LayerSpec], start: int, end: int, runs: list[Run]
) -> list[Run]:
    """Drop runs whose stacked saved vars another layer of the stage also stashes (the
    unrolled stash keeps such a var once; the scan would keep it twice)."""
    kept = []
    for r in runs:
        outside = [layers[i] for i in range(start, end + 1) if not r.first <= i <= r.last]
        others = {n for layer in outside for n in layer.saved}
        if not stacked_saved_names(layers, r) & others:
            kept.append(r)
    return kept
