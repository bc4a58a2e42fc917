"""`schedule: auto` measures its layer profiles without the split backward (B and W), and
the split only of the stages a zero-bubble plan that could be best rests on (real JAX
programs on virtual CPU devices, the real runner and store)."""

import json

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from client.symbolic_batch import build_zoo_symbolic
from schemas import ClusterSpec, JobStatus, ModelSpec, ModuleKind, StageProfileResult
from store import JobCandidateRow, StageProfileRow, session_scope
from tests.support.jobs import queue_job
from tests.support.models import FAST_OPTIONS, TINY_GPT, tiny_gpt
from workers.jobs.runner import JobRunner, RunnerConfig

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

AUTO = FAST_OPTIONS.model_copy(update={"schedule": "auto"})
CLUSTER = ClusterSpec(num_hosts=1, devices_per_host=2)


def _recorded(sessions: sessionmaker[Session], job_id: str) -> dict[str, StageProfileResult]:
    """The job's candidates' fingerprints -> the stored result recorded for them."""
    with session_scope(sessions) as s:
        rows = s.execute(
            select(JobCandidateRow.fingerprint, StageProfileRow.result)
            .join(StageProfileRow, StageProfileRow.id == JobCandidateRow.profile_id)
            .where(JobCandidateRow.job_id == job_id)
        ).all()
    return {
        fp: StageProfileResult.model_validate(
            json.loads(result) if isinstance(result, str) else result
        )
        for fp, result in rows
    }


def _split(result: StageProfileResult) -> bool:
    return result.module(ModuleKind.backward_input) is not None


def test_auto_measures_the_split_only_where_a_zero_bubble_plan_needs_it(
    sessions: sessionmaker[Session],
) -> None:
    runner = JobRunner(sessions, RunnerConfig(num_workers=2, lease_seconds=20))
    job_id = queue_job(sessions, tiny_gpt(num_layers=2), AUTO, CLUSTER)
    outcome = runner.run_next()
    assert outcome is not None and outcome.status == JobStatus.done, outcome
    plan = outcome.plan
    assert plan is not None and plan.search is not None
    recorded = _recorded(sessions, job_id)
    unsplit = [r for r in recorded.values() if not _split(r)]
    assert unsplit, "the layer profiles are measured without the split"
    for r in unsplit:  # stored as their own stages, under their own fingerprints
        assert r.fingerprint not in recorded and r.ok
        assert r.module(ModuleKind.apply_grad) is not None
    if plan.schedule_name == "zb-h1":  # its stages were measured split
        assert all(
            st.input_grad_cost is not None and st.weight_cost is not None for st in plan.stages
        )
        assert all(st.measured for st in plan.stages)
    resplit = [fp for fp, r in recorded.items() if _split(r) and r.fingerprint == fp]
    assert len(resplit) < len(recorded)
    assert plan.search.split_on_demand <= len(resplit)

    # a second auto job reuses both kinds and measures nothing
    again_id = queue_job(sessions, tiny_gpt(num_layers=2), AUTO, CLUSTER)
    again = runner.run_next()
    assert again is not None and again.job_id == again_id and again.status == JobStatus.done
    assert again.stats.measured == 0 and again.stats.actors_started == 0
    assert again.plan is not None and again.plan.schedule_name == plan.schedule_name
    assert [(s.start, s.end, s.submesh_id, s.config_id) for s in again.plan.stages] == [
        (s.start, s.end, s.submesh_id, s.config_id) for s in plan.stages
    ]

    # the unsplit stages are what a 1F1B job measures: it reuses them
    one_f_one_b = queue_job(sessions, tiny_gpt(num_layers=2), FAST_OPTIONS, CLUSTER)
    third = runner.run_next()
    assert third is not None and third.job_id == one_f_one_b
    assert third.status == JobStatus.done
    reused = _recorded(sessions, one_f_one_b)
    twins = {r.fingerprint for r in unsplit}
    assert twins <= set(reused)  # every unsplit layer profile is a 1F1B candidate's stage
    assert third.stats.reused >= len(twins)


def test_a_job_searching_counts_measures_each_counts_split_on_demand(
    sessions: sessionmaker[Session],
) -> None:
    symbolic: ModelSpec = build_zoo_symbolic("gpt", remat_variants=(), num_layers=1, **TINY_GPT)
    options = AUTO.model_copy(
        update={"num_microbatches": 2, "global_batch_size": 8, "microbatch_search": [2, 4]}
    )
    runner = JobRunner(sessions, RunnerConfig(num_workers=2, lease_seconds=20))
    job_id = queue_job(sessions, symbolic, options, CLUSTER)
    outcome = runner.run_next()
    assert outcome is not None and outcome.status == JobStatus.done, outcome
    plan = outcome.plan
    assert plan is not None and plan.microbatch_options
    recorded = _recorded(sessions, job_id)
    unsplit = [r for r in recorded.values() if not _split(r)]
    assert unsplit, "the end sizes' layer profiles are measured without the split"
    assert all(r.fingerprint not in recorded for r in unsplit)
    if plan.schedule_name == "zb-h1":
        assert all(st.measured and st.input_grad_cost is not None for st in plan.stages)
