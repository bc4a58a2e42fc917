"""One job searches the count of micro-batches (`microbatch_search`) on a tiny GPT traced
with a symbolic batch dimension: one measuring pool for every count, each count's candidates
stored at its micro-batch size, and the plan is the fastest of the per-count answers that a
fixed-count job of each count gives on the same store."""

from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from client.symbolic_batch import build_zoo_symbolic
from planner.layer_profiles import is_profiled
from programs import spec_at_batch
from schemas import ClusterSpec, JobStatus, ModelSpec, Plan
from store import JobCandidateRow, StageProfileRow, get_job, session_scope
from tests.support.jobs import queue_job
from tests.support.models import FAST_OPTIONS, TINY_GPT
from workers.cluster import GroupPool
from workers.jobs import runner as runner_module
from workers.jobs.runner import JobRunner, RunnerConfig

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

CLUSTER = ClusterSpec(num_hosts=1, devices_per_host=2)
COUNTS = [2, 4]
GLOBAL_BATCH = 8
SEARCH = FAST_OPTIONS.model_copy(
    update={"num_microbatches": 2, "global_batch_size": GLOBAL_BATCH, "microbatch_search": COUNTS}
)


@pytest.fixture(scope="module")
def symbolic() -> ModelSpec:
    """The tiny GPT of one block, traced at micro-batch 4 with a symbolic batch."""
    return build_zoo_symbolic("gpt", remat_variants=(), num_layers=1, **TINY_GPT)


def _sizes(sessions: sessionmaker[Session], job_id: str) -> dict[int, int]:
    """The job's candidates by micro-batch size."""
    with session_scope(sessions) as s:
        rows = s.execute(
            select(JobCandidateRow.micro_batch_size, func.count())
            .where(JobCandidateRow.job_id == job_id)
            .group_by(JobCandidateRow.micro_batch_size)
        )
        return {int(size): int(n) for size, n in rows}


def test_one_job_searches_every_count_on_one_pool(
    sessions: sessionmaker[Session], symbolic: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    pools: list[GroupPool] = []

    class CountedPool(GroupPool):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            pools.append(self)

    monkeypatch.setattr(runner_module, "GroupPool", CountedPool)
    runner = JobRunner(sessions, RunnerConfig(num_workers=2, lease_seconds=20))
    job_id = queue_job(sessions, symbolic, SEARCH, CLUSTER)
    outcome = runner.run_next()
    assert outcome is not None and outcome.job_id == job_id
    assert outcome.status == JobStatus.done, outcome.error
    plan = outcome.plan
    assert plan is not None
    assert len(pools) == 1  # one pool measured every count's stages
    assert [o.num_microbatches for o in plan.microbatch_options] == COUNTS
    assert [o.micro_batch_size for o in plan.microbatch_options] == [4, 2]
    assert plan.micro_batch_size == GLOBAL_BATCH // plan.num_microbatches
    chosen = [o for o in plan.microbatch_options if o.chosen]
    assert [o.num_microbatches for o in chosen] == [plan.num_microbatches]
    # each count's candidates stored at its size; progress counts them all
    sizes = _sizes(sessions, job_id)
    assert set(sizes) == {4, 2} and all(n > 0 for n in sizes.values())
    with session_scope(sessions) as s:
        row = get_job(s, job_id=job_id)
        assert row is not None and row.candidates == sum(sizes.values())
        assert row.done == row.distinct_stages
        assert row.plan is not None and Plan.model_validate(row.plan).microbatch_options

    # the reference: each count planned as a fixed job on the same store
    fixed: dict[int, Plan] = {}
    for b in COUNTS:
        at_size = spec_at_batch(symbolic, GLOBAL_BATCH // b)
        ref_id = queue_job(sessions, at_size, SEARCH.at_count(b, 4), CLUSTER)
        ref = runner.run_next()
        assert ref is not None and ref.job_id == ref_id
        assert ref.status == JobStatus.done and ref.plan is not None, ref.error
        assert _sizes(sessions, ref_id).keys() == {0}
        fixed[b] = ref.plan
        if b == plan.num_microbatches:  # every stage its search needs is stored already
            assert ref.stats.measured == 0
    fastest = min(COUNTS, key=lambda b: (fixed[b].predicted_iteration_time_s, b))
    assert plan.num_microbatches == fastest
    assert plan.predicted_iteration_time_s == pytest.approx(
        fixed[fastest].predicted_iteration_time_s
    )
    assert [(st.start, st.end) for st in plan.stages] == [
        (st.start, st.end) for st in fixed[fastest].stages
    ]


def _layer_profiles(
    sessions: sessionmaker[Session], job_id: str, spec: ModelSpec
) -> dict[int, tuple[int, int]]:
    """Per micro-batch size: (layer-profile stages measured, layer-profile stages), distinct
    fingerprints of the stages a search measures up front (`planner.estimate.is_profiled`)."""
    classes = [x.fingerprint for x in spec.layers]
    with session_scope(sessions) as s:
        rows = s.execute(
            select(
                JobCandidateRow.micro_batch_size,
                JobCandidateRow.fingerprint,
                JobCandidateRow.profile_id,
                JobCandidateRow.start,
                JobCandidateRow.end,
                JobCandidateRow.submesh_id,
                JobCandidateRow.config_id,
            ).where(JobCandidateRow.job_id == job_id)
        ).all()
    out: dict[int, tuple[set[str], set[str]]] = {}
    for size, fp, profile, start, end, submesh, config in rows:
        if not is_profiled((start, end, submesh, config), classes):
            continue
        measured, every = out.setdefault(int(size), (set(), set()))
        every.add(fp)
        if profile is not None:
            measured.add(fp)
    return {size: (len(m), len(e)) for size, (m, e) in out.items()}


def test_a_count_between_two_sizes_starts_from_interpolated_layer_profiles(
    sessions: sessionmaker[Session], symbolic: ModelSpec
) -> None:
    """Counts 2, 4, 8 (micro-batches of 4, 2, 1): the layer profiles of micro-batch 2 on the
    one-device submesh (a config every size has) are interpolated from 1 and 4, not
    measured (before: every count measured all of its own); none is stored as a
    measurement; the plan is made of measured stages."""
    counts = [2, 4, 8]
    options = SEARCH.model_copy(update={"microbatch_search": counts})
    runner = JobRunner(sessions, RunnerConfig(num_workers=2, lease_seconds=20))
    job_id = queue_job(sessions, symbolic, options, CLUSTER)
    outcome = runner.run_next()
    assert outcome is not None and outcome.job_id == job_id
    assert outcome.status == JobStatus.done and outcome.plan is not None, outcome.error
    plan = outcome.plan
    assert plan.stages and all(st.measured for st in [*plan.stages, *plan.outside])
    profiles = _layer_profiles(sessions, job_id, symbolic)
    assert set(profiles) == {4, 2, 1}
    for size in (4, 1):  # the ends: every layer profile measured
        assert profiles[size][0] == profiles[size][1] > 0, profiles
    assert profiles[2][0] < profiles[2][1], profiles  # between: fewer measured
    with session_scope(sessions) as s:  # what was not measured has no measurement stored
        unmeasured = s.scalars(
            select(JobCandidateRow.fingerprint).where(
                JobCandidateRow.job_id == job_id, JobCandidateRow.profile_id.is_(None)
            )
        ).all()
        assert unmeasured
        stored = s.scalars(
            select(func.count())
            .select_from(StageProfileRow)
            .where(StageProfileRow.fingerprint.in_(unmeasured))
        ).one()
        assert stored == 0
        statuses = set(
            s.scalars(
                select(JobCandidateRow.status).where(
                    JobCandidateRow.job_id == job_id,
                    JobCandidateRow.micro_batch_size == 2,
                    JobCandidateRow.end - JobCandidateRow.start <= 1,
                    JobCandidateRow.profile_id.is_(None),
                )
            ).all()
        )
        assert statuses <= {"estimated", "pruned"} and "estimated" in statuses
