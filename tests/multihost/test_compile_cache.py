"""The compilation cache across a measuring group of two processes on two nodes: jax writes
the cache from process 0 only, and on CPU the other processes' cache keys differ from its
own (jax makes them the same across processes on GPUs only), so a new group's rank 0 loads
what an earlier group compiled while rank 1 compiles again. The group still measures the
same stage (one SPMD program over gloo, from a loaded and a compiled executable) and counts
a module as loaded only when every rank loaded it."""

from pathlib import Path

import pytest

from planner import enumerate_candidates
from schemas import ModelSpec, ProfileStatus, StageProfileResult
from tests.multihost.cluster import CLUSTER, OPTIONS
from tests.support.models import tiny_gpt
from tests.support.waiting import wait_until
from workers.cluster.placement import GroupShape
from workers.cluster.pool import CandidateTask, GroupPool, PoolConfig

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("two_nodes")]


def _measure_2x2(spec: ModelSpec) -> StageProfileResult:
    """The first 2-host candidate, measured by a new pool (a new group of two processes)."""
    space = enumerate_candidates(spec, CLUSTER, OPTIONS)
    key = next(k for k in space.keys if space.submeshes[k.submesh_id].as_tuple() == (2, 2))
    pool = GroupPool(
        PoolConfig(),
        model_key="m",
        spec=spec,
        cluster=CLUSTER,
        options=OPTIONS,
        failure_result=lambda task, status, error: (status, error),
    )
    try:
        pool.submit(CandidateTask("fp", key, space.submeshes[key.submesh_id]))
        (group,) = pool.groups
        assert group.shape == GroupShape(2, 2)
        (result,) = wait_until(lambda: pool.poll(1.0), 240, "a result", interval_s=0)
    finally:
        pool.shutdown()
    return result


def test_a_new_two_host_group_with_the_cache_warm_measures_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAGEPROF_COMPILE_CACHE_DIR", str(tmp_path / "xla"))
    spec = tiny_gpt(num_layers=1)
    cold = _measure_2x2(spec)
    warm = _measure_2x2(spec)
    assert cold.status == warm.status == ProfileStatus.ok, (cold.error, warm.error)
    assert len(cold.measured_by) == len(warm.measured_by) == 2
    assert any(p.name.startswith("jit__forward-") for p in (tmp_path / "xla").iterdir())
    assert cold.compile_cache_hits == warm.compile_cache_hits == 0  # rank 1 compiled both times
    for c, w in zip(cold.module_profile_results, warm.module_profile_results, strict=True):
        assert (w.flops, w.peak_memory, w.collective_bytes) == (
            c.flops,
            c.peak_memory,
            c.collective_bytes,
        )
        assert w.compute_cost > 0
