"""Which stages the estimates are made from (Alpa's layer-wise profiling, PR #681): layer
profiles, the stages of one layer and of two adjacent differing layers measured up front,
and on the submesh of every device, the layers measured on demand (`with_layer_profiles`).
"""

from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet

from planner.candidates import CandidateSpace
from planner.table import Key
from schemas import StageKey

# (submesh, config) whose adjacent pairs are measured up front: the space's first, the
# smallest submesh, where a pair compiles fastest
REFERENCE = (0, 0)


def is_layer_profile(key: Key) -> bool:
    """A stage of one layer or of two adjacent layers: what the estimates are made from."""
    return key[1] - key[0] <= 1


def is_profiled(key: Key, layer_classes: Sequence[int] | Sequence[str]) -> bool:
    """A stage measured up front to estimate from: one layer, or, on the `REFERENCE`
    submesh and config, two adjacent layers that differ (what their boundary costs).
    Elsewhere a boundary is the reference's, scaled by what the two layers cost there and
    here (`StageEstimator.raw`), and two identical layers' boundary is learned from the
    fitted model; such a pair is measured only if a plan that could be best has it."""
    a, b = key[0], key[1]
    if a == b:
        return True
    return b == a + 1 and layer_classes[a] != layer_classes[b] and key[2:] == REFERENCE


def layer_profile_keys(
    space: CandidateSpace,
    layer_classes: Sequence[int] | Sequence[str],
    scaled: Iterable[Key] = (),
) -> list[Key]:
    """The candidates measured up front (`is_profiled`, but those `scaled` until measured
    on demand: `with_layer_profiles`), in the space's order."""
    later = set(scaled)
    return [
        k.as_tuple()
        for k in space.keys
        if is_profiled(k.as_tuple(), layer_classes) and k.as_tuple() not in later
    ]


def with_layer_profiles(
    space: CandidateSpace, layer_fingerprints: Sequence[str]
) -> tuple[CandidateSpace, list[Key], list[Key]]:
    """The space with the layer profiles its estimates need, the stages estimated by
    scaling instead, and the stages to measure directly (a cluster of one submesh: its
    whole-model stages are the only plans).

    A submesh using every device holds only the whole model (Alpa's rule), so it has no
    layer profiles of its own. Its whole-model stages are estimated by scaling the fastest
    whole-model stage on a smaller submesh (`planner.estimate_table`: perfect scaling times
    the shortfall measured, else the shortfall of the step below). Where its distinct
    layers and adjacent pairs would compile fewer layers than the whole model, its layers
    are added too, scaled like it and measured on demand: when a plan that could be best
    holds a whole-model stage there, its config's layers are measured first
    (`on_demand_profiles`; their boundaries are the `REFERENCE`'s) and the stage is then
    estimated from them, measured only if a plan that could be best still holds it.
    Elsewhere a scaled stage is measured when a plan that could be best holds one."""
    num_layers = len(layer_fingerprints)
    singles = len(set(layer_fingerprints))
    pairs = len(
        {(a, b) for a, b in zip(layer_fingerprints, layer_fingerprints[1:], strict=False) if a != b}
    )
    keys = list(space.keys)
    have = {k.as_tuple() for k in keys}
    scaled: list[Key] = []
    direct: list[Key] = []
    for m in range(len(space.submeshes)):
        own = [k for k in have if k[2] == m]
        if not own or any(is_layer_profile(k) for k in own) or num_layers <= 2:
            continue
        whole = sorted(k for k in own if (k[0], k[1]) == (0, num_layers - 1))
        if len(space.submeshes) == 1:
            direct += whole
            continue
        scaled += whole
        if singles + 2 * pairs >= num_layers:
            continue
        for c in range(len(space.configs[m])):
            for a in range(num_layers):
                for b in (a, a + 1):
                    key = (a, b, m, c)
                    if b < num_layers and key not in have and is_profiled(key, layer_fingerprints):
                        keys.append(StageKey(start=a, end=b, submesh_id=m, config_id=c))
                        scaled.append(key)
    return CandidateSpace(space.submeshes, space.configs, keys), scaled, direct


def on_demand_profiles(key: Key, scaled: AbstractSet[Key]) -> list[Key]:
    """The layer profiles a scaled whole-model stage `key` is estimated from once they are
    measured (its config's scaled one-layer stages, one per layer: `with_layer_profiles`);
    none elsewhere (e.g. where only the layers outside the pipeline are candidates)."""
    singles = [(a, a, *key[2:]) for a in range(key[0], key[1] + 1)]
    if is_layer_profile(key) or not all(k in scaled for k in singles):
        return []
    return singles
