"""The persistent compilation cache across jobs: a second job's fresh actors load the
executables the first job's actors compiled, and say so per module; off, nothing is loaded."""

from pathlib import Path

import pytest
from sqlalchemy import select

from migrations import upgrade
from schemas import ClusterSpec, JobStatus, StageProfileResult
from store import StageProfileRow, make_engine, make_sessionmaker, profile_result, session_scope
from tests.support.jobs import queue_job
from tests.support.models import tiny_gpt
from workers.jobs.runner import JobRunner, RunnerConfig

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

# Two devices, data parallel only: the few stages of embed, block, head (no two share a
# compiled module).
TWO_DEVICES = ClusterSpec(num_hosts=1, devices_per_host=2)


def _plan_on_a_fresh_store(tmp_path: Path, name: str) -> list[StageProfileResult]:
    """Plan the 1-block tiny GPT in a new SQLite store with a new runner (fresh actors);
    the stages it measured."""
    url = f"sqlite:///{tmp_path / f'{name}.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        sessions = make_sessionmaker(engine)
        queue_job(sessions, tiny_gpt(num_layers=1), cluster=TWO_DEVICES)
        runner = JobRunner(sessions, RunnerConfig(num_workers=1, lease_seconds=20))
        outcome = runner.run_next()
        assert outcome is not None and outcome.status == JobStatus.done, outcome
        assert outcome.stats.measured > 0 and outcome.stats.actors_started >= 1
        with session_scope(sessions) as s:
            results = [profile_result(row) for row in s.scalars(select(StageProfileRow))]
    finally:
        engine.dispose()
    assert results and all(r.ok for r in results)
    return results


def _hits(results: list[StageProfileResult]) -> tuple[int, int]:
    """(modules loaded from the cache, modules), checking each stage's count."""
    for r in results:
        assert r.compile_cache_hits == sum(m.compile_cache_hit for m in r.module_profile_results)
    modules = [m for r in results for m in r.module_profile_results]
    return sum(m.compile_cache_hit for m in modules), len(modules)


def test_a_second_job_on_fresh_actors_loads_what_the_first_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "xla"
    monkeypatch.setenv("STAGEPROF_COMPILE_CACHE_DIR", str(cache))
    first = _plan_on_a_fresh_store(tmp_path, "first")
    hits, modules = _hits(first)
    assert hits == 0 and modules >= 3
    assert any(p.name.startswith("jit__forward-") for p in cache.iterdir())

    second = _plan_on_a_fresh_store(tmp_path, "second")
    assert _hits(second)[0] > 0
    by_fingerprint = {r.fingerprint: r for r in first}
    again = [r for r in second if r.fingerprint in by_fingerprint]
    assert again  # the searches may differ (timings do), never entirely
    for r in again:  # every module compiled by the first job is loaded, the same program
        assert r.compile_cache_hits == len(r.module_profile_results) == 3
        cold = by_fingerprint[r.fingerprint]
        pairs = zip(r.module_profile_results, cold.module_profile_results, strict=True)
        for warm_m, cold_m in pairs:
            assert (warm_m.module, warm_m.peak_memory, warm_m.flops) == (
                cold_m.module,
                cold_m.peak_memory,
                cold_m.flops,
            )


def test_off_a_second_job_loads_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Off, the second job compiles again what the first did (on, wherever the cache were,
    it would load it)."""
    monkeypatch.setenv("STAGEPROF_COMPILE_CACHE_DIR", "off")
    for name in ("first", "second"):
        hits, modules = _hits(_plan_on_a_fresh_store(tmp_path, name))
        assert hits == 0 and modules >= 3
