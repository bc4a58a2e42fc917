"""`PlanOptions.measure_stages` on a real job: a stage the estimate search leaves estimated
(or cannot even estimate), or a remat variant that memory leaves unneeded, is measured when
the job is asked for it."""

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from schemas import ClusterSpec, JobStatus, StageKey
from store import JobCandidateRow, session_scope
from tests.support.jobs import queue_job
from tests.support.models import FAST_OPTIONS, tiny_gpt
from workers.jobs.runner import JobRunner, RunnerConfig

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

Key = tuple[int, int, int, int]
# Two devices: a stage on both is the whole model, which no layer profile can estimate.
CLUSTER = ClusterSpec(num_hosts=1, devices_per_host=2)


def statuses(sessions: sessionmaker[Session], job_id: str) -> dict[Key, str | None]:
    """Each candidate's status in the job's profile table."""
    c = JobCandidateRow
    stmt = select(c.start, c.end, c.submesh_id, c.config_id, c.status).where(c.job_id == job_id)
    with session_scope(sessions, write=False) as s:
        return {(a, b, m, k): status for a, b, m, k, status in s.execute(stmt)}


def test_stages_asked_for_are_measured_where_the_search_would_not(
    sessions: sessionmaker[Session],
) -> None:
    assert FAST_OPTIONS.search_mode == "estimate"  # the default search
    spec = tiny_gpt(num_layers=2)  # embedding, 2 blocks, head: 4 layers
    runner = JobRunner(sessions, RunnerConfig(num_workers=1, lease_seconds=20))

    plain = queue_job(sessions, spec, cluster=CLUSTER)
    first = runner.run_next(plain)
    assert first is not None and first.status == JobStatus.done, first
    before = statuses(sessions, plain)
    estimated = sorted(k for k, s in before.items() if s == "estimated")
    assert len(estimated) >= 2, before
    asked = [estimated[0], estimated[-1]]
    print(f"without measure_stages: {', '.join(f'{k} {before[k]}' for k in asked)}")

    keys = [StageKey(start=a, end=b, submesh_id=m, config_id=c) for a, b, m, c in asked]
    options = FAST_OPTIONS.model_copy(update={"measure_stages": keys})
    job = queue_job(sessions, spec, options, cluster=CLUSTER)
    second = runner.run_next(job)
    assert second is not None and second.status == JobStatus.done, second
    after = statuses(sessions, job)
    print(f"with measure_stages:    {', '.join(f'{k} {after[k]}' for k in asked)}")
    assert [after[k] for k in asked] == ["ok", "ok"]
    # the rest came from the first job's measurements: only what was asked (or what the
    # search chose to verify with it) was measured
    assert second.stats.measured >= len(asked) and second.stats.reused > 0


@pytest.mark.parametrize(
    "search",
    [
        "exhaustive",  # the gate's default ("prune" takes the same path for variants)
        "estimate",
    ],
)
def test_a_remat_variant_asked_for_is_measured_where_memory_leaves_it_unneeded(
    sessions: sessionmaker[Session], search: str
) -> None:
    """With remat: auto on ample memory, the remat-variant stages are not needed and
    skipped, unless asked for."""
    spec = tiny_gpt(num_layers=1)  # embedding, block, head; carries the full and dots variants
    options = FAST_OPTIONS.model_copy(update={"remat": "auto", "search": search})
    assert options.search_mode == search
    runner = JobRunner(sessions, RunnerConfig(num_workers=1, lease_seconds=20))

    plain = queue_job(sessions, spec, options, cluster=CLUSTER)
    first = runner.run_next(plain)
    assert first is not None and first.status == JobStatus.done, first
    before = statuses(sessions, plain)
    # configs 1 and 2 of a submesh: its data config under the full and dots variants; they
    # are skipped, except where no layer of the stage carries a variant (the embedding
    # alone: the same stage as written, measured)
    skipped = sorted(k for k, s in before.items() if k[3] > 0 and s == "pruned")
    assert skipped, before
    asked = skipped[-1]

    key = StageKey(start=asked[0], end=asked[1], submesh_id=asked[2], config_id=asked[3])
    job = queue_job(
        sessions, spec, options.model_copy(update={"measure_stages": [key]}), cluster=CLUSTER
    )
    second = runner.run_next(job)
    assert second is not None and second.status == JobStatus.done, second
    after = statuses(sessions, job)
    print(f"remat variant {asked}: {before[asked]} without measure_stages, {after[asked]} with")
    assert after[asked] == "ok"
    assert second.stats.measured == 1  # everything else reused or skipped as before
