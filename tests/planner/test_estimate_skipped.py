"""Stages a job decides not to measure (remat variants where memory is ample) are never
asked for by the estimate search: before, the whole model on every device under a variant
kept its optimistic scaled bound after the as-written one was measured, a round asked for it,
and the loop stopped early ("asked for nothing new")."""

import random

import pytest

from planner import CandidateSpace, EstimateSearch, enumerate_candidates, with_layer_profiles
from planner.layer_profiles import is_profiled
from planner.table import Key
from schemas import ClusterSpec, PlanOptions
from tests.planner.helpers import programless_chain_spec
from tests.support.profiles import fake_profile

CLASSES = ["embed", "block", "block", "head"]


def _with_variant(space: CandidateSpace) -> CandidateSpace:
    """Every config also under the `full` remat variant (as a spec with variants gets)."""
    configs = [[*cs, *(c.model_copy(update={"remat": "full"}) for c in cs)] for cs in space.configs]
    keys = list(space.keys)
    for k in space.keys:
        n = len(space.configs[k.submesh_id])
        keys.append(k.model_copy(update={"config_id": k.config_id + n}))
    return CandidateSpace(space.submeshes, configs, keys)


@pytest.mark.parametrize("seed", range(6))
def test_skipped_stages_are_never_asked_for(seed: int) -> None:
    spec = programless_chain_spec(len(CLASSES))
    layers = [
        x.model_copy(update={"fingerprint": f}) for x, f in zip(spec.layers, CLASSES, strict=True)
    ]
    spec = spec.model_copy(update={"layers": layers})
    cluster = ClusterSpec(num_hosts=1, devices_per_host=2)
    options = PlanOptions(config_space="data_parallel_only", strategies=["data"])
    space = _with_variant(enumerate_candidates(spec, cluster, options))
    space, scaled, _ = with_layer_profiles(space, CLASSES)
    assert any(space.is_remat(k) for k in scaled)  # the variant's whole model is scaled
    rnd = random.Random(seed)
    noise: dict[tuple[tuple[str, ...], int, int], float] = {}

    def truth(key: Key) -> object:
        a, b, m, c = key
        devices = space.submeshes[m].num_devices
        work = sum(2e-4 if x == "block" else 8e-5 for x in CLASSES[a : b + 1])
        signature = (tuple(CLASSES[a : b + 1]), m, c)
        noise.setdefault(signature, rnd.uniform(0.7, 1.4))
        t = work / devices**0.7 * noise[signature] + 5e-5
        return fake_profile(f"{key}", forward=t / 3, backward=2 * t / 3, num_layers=b - a + 1)

    keys = [k.as_tuple() for k in space.keys]
    skipped = {k for k in keys if space.is_remat(k)}
    search = EstimateSearch(spec, cluster, options, space, frozenset(scaled))
    search.skip(skipped)
    for key in keys:
        if is_profiled(key, CLASSES) and key not in skipped:
            search.add([key], truth(key))
    for key in scaled:
        if key not in skipped and key not in search.point_table().estimated:
            search.add([key], truth(key))
    while asked := search.next_round():
        assert not set(asked) & skipped, asked
        for key in asked:
            search.add([key], truth(key))
    assert search.stopped == "the best plan is measured"
    assert all(s.config.remat == "as_written" for s in search.plan().stages)
