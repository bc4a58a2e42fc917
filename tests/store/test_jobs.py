"""Jobs: claiming with leases (concurrent claimers, expiry), progress, cancel, finish."""

import threading
from datetime import timedelta

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from schemas import ClusterSpec, JobStatus, PlanOptions, StageKey
from store import (
    CandidateIn,
    JobRow,
    add_candidates,
    claim_job,
    create_job,
    finish_job,
    get_job,
    job_to_schema,
    list_jobs,
    put_model,
    record_result,
    refresh_progress,
    renew_lease,
    request_cancel,
    save_profile,
    session_scope,
    set_job_waiting,
    utcnow,
)
from tests.store.factories import profile, tiny_spec


def _job(session: Session) -> JobRow:
    model, _ = put_model(session, spec=tiny_spec())
    return create_job(session, model_id=model.id, cluster=ClusterSpec(), options=PlanOptions())


def test_create_and_claim(session: Session) -> None:
    job = _job(session)
    assert job.status == "queued"
    claimed = claim_job(session, owner="r1", lease_seconds=30)
    assert claimed is not None and claimed.id == job.id
    assert claimed.status == "profiling" and claimed.lease_owner == "r1"
    assert claimed.started_at is not None and claimed.attempts == 1
    assert claim_job(session, owner="r2", lease_seconds=30) is None


def test_zoo_job_has_no_model_until_built(session: Session) -> None:
    job = create_job(
        session,
        zoo_name="gpt",
        zoo_config={"num_layers": 2},
        cluster=ClusterSpec(),
        options=PlanOptions(),
    )
    view = job_to_schema(session, job)
    assert view.model_id is None and view.zoo is not None and view.zoo.name == "gpt"


def test_expired_lease_is_taken_over(session: Session) -> None:
    job = _job(session)
    assert claim_job(session, owner="dead", lease_seconds=30) is not None
    assert claim_job(session, owner="r2", lease_seconds=30) is None
    session.execute(
        update(JobRow).where(JobRow.id == job.id).values(lease_expires_at=utcnow() - timedelta(1))
    )
    taken = claim_job(session, owner="r2", lease_seconds=30)
    assert taken is not None and taken.lease_owner == "r2" and taken.attempts == 2
    assert taken.status == "profiling"
    assert not renew_lease(session, job_id=job.id, owner="dead", lease_seconds=30)
    assert renew_lease(session, job_id=job.id, owner="r2", lease_seconds=30)


def test_concurrent_claimers_never_share_a_job(committing: sessionmaker[Session]) -> None:
    with session_scope(committing) as s:
        model, _ = put_model(s, spec=tiny_spec())
        ids = {
            create_job(s, model_id=model.id, cluster=ClusterSpec(), options=PlanOptions()).id
            for _ in range(12)
        }
    claims: dict[str, list[str]] = {"a": [], "b": [], "c": []}
    barrier = threading.Barrier(len(claims))

    def claimer(owner: str) -> None:
        barrier.wait()
        while True:
            with session_scope(committing) as s:
                row = claim_job(s, owner=owner, lease_seconds=60)
                if row is None:
                    if not _any_queued(s):
                        return
                    continue
                claims[owner].append(row.id)

    threads = [threading.Thread(target=claimer, args=(o,)) for o in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    got = [j for owned in claims.values() for j in owned]
    assert sorted(got) == sorted(ids)  # each job exactly once
    with session_scope(committing) as s:
        for owner, owned in claims.items():
            for job_id in owned:
                row = get_job(s, job_id=job_id)
                assert row is not None and row.lease_owner == owner


def _any_queued(session: Session) -> bool:
    return bool(list_jobs(session, status=JobStatus.queued, limit=1))


def test_progress_counts_from_candidates(session: Session) -> None:
    job = _job(session)
    cands = [
        CandidateIn(StageKey(start=0, end=0, submesh_id=0, config_id=0), "fa", 2, "data"),
        CandidateIn(StageKey(start=1, end=1, submesh_id=0, config_id=0), "fa", 2, "data"),
        CandidateIn(StageKey(start=0, end=1, submesh_id=0, config_id=0), "fb", 2, "data"),
        CandidateIn(StageKey(start=0, end=1, submesh_id=0, config_id=1), "fc", 2, "fsdp"),
    ]
    assert add_candidates(session, job_id=job.id, model_id=job.model_id, candidates=cands) == 4
    assert add_candidates(session, job_id=job.id, model_id=job.model_id, candidates=cands) == 0
    record_result(
        session, job_id=job.id, profile=save_profile(session, result=profile("fa")), reused=False
    )
    record_result(
        session, job_id=job.id, profile=save_profile(session, result=profile("fb")), reused=True
    )
    from schemas import ProfileStatus

    failed = save_profile(session, result=profile("fc", ProfileStatus.oom))
    record_result(session, job_id=job.id, profile=failed, reused=False)
    progress = refresh_progress(session, job_id=job.id)
    # in stages: fa measured (its two candidates share it), fb reused, fc failed
    assert progress.candidates == 4 and progress.distinct_stages == 3
    assert (progress.measured, progress.reused, progress.failed, progress.pruned) == (1, 1, 1, 0)
    assert progress.done == 3 and progress.pending == 0
    session.refresh(job)
    assert job_to_schema(session, job).progress == progress


def test_cancel_queued_and_running(session: Session) -> None:
    queued = _job(session)
    assert request_cancel(session, job_id=queued.id).status == "cancelled"  # type: ignore[union-attr]
    running = _job(session)
    claim_job(session, owner="r1", lease_seconds=30)
    row = request_cancel(session, job_id=running.id)
    assert row is not None and row.status == "profiling" and row.cancel_requested
    assert not renew_lease(session, job_id=running.id, owner="r1", lease_seconds=30)
    assert claim_job(session, owner="r2", lease_seconds=30) is None
    assert finish_job(session, job_id=running.id, owner="r1", status=JobStatus.cancelled)
    assert request_cancel(session, job_id="nope") is None


def test_only_the_owner_finishes(session: Session) -> None:
    job = _job(session)
    claim_job(session, owner="r1", lease_seconds=30)
    assert not finish_job(session, job_id=job.id, owner="r2", status=JobStatus.done)
    assert finish_job(session, job_id=job.id, owner="r1", status=JobStatus.failed, error="why")
    session.refresh(job)
    assert job.status == "failed" and job.error == "why" and job.finished_at is not None
    assert not finish_job(session, job_id=job.id, owner="r1", status=JobStatus.done)


def test_list_jobs_newest_first_and_pages(session: Session) -> None:
    ids = [_job(session).id for _ in range(3)]
    page = list_jobs(session, limit=2)
    assert [j.id for j in page] == ids[::-1][:2]
    rest = list_jobs(session, limit=2, before=page[-1].id)
    assert [j.id for j in rest] == [ids[0]]


def test_status_moves_model_attach_and_counts(session: Session) -> None:
    from store import count_jobs_by_status, is_cancel_requested, set_job_model, set_job_status

    job = create_job(
        session, zoo_name="mlp", zoo_config={}, cluster=ClusterSpec(), options=PlanOptions()
    )
    assert count_jobs_by_status(session).get("queued", 0) >= 1
    assert not set_job_status(session, job_id=job.id, owner="r1", status=JobStatus.planning)
    claim_job(session, owner="r1", lease_seconds=30)
    assert not set_job_status(session, job_id=job.id, owner="r2", status=JobStatus.planning)
    assert set_job_status(session, job_id=job.id, owner="r1", status=JobStatus.planning)
    model, _ = put_model(session, spec=tiny_spec())
    set_job_model(session, job_id=job.id, model_id=model.id)
    session.refresh(job)
    assert job.status == "planning" and job.model_id == model.id
    assert not is_cancel_requested(session, job_id=job.id)
    request_cancel(session, job_id=job.id)
    assert is_cancel_requested(session, job_id=job.id)
    assert count_jobs_by_status(session).get("planning", 0) >= 1


def test_models_listed_newest_first(session: Session) -> None:
    from store import get_model_row, list_models

    a, _ = put_model(session, spec=tiny_spec(width=8))
    b, _ = put_model(session, spec=tiny_spec(width=16))
    ids = [m.id for m in list_models(session, limit=10)]
    assert ids.index(b.id) < ids.index(a.id)
    assert get_model_row(session, model_id=a.id) is a


def test_a_running_job_says_what_it_waits_for_until_it_ends(session: Session) -> None:
    job = _job(session)
    claim_job(session, owner="r1", lease_seconds=30)
    waiting = "waiting for devices held by another job (2 x 4)"
    assert not set_job_waiting(session, job_id=job.id, owner="r2", waiting=waiting)
    assert job_to_schema(session, get_job(session, job_id=job.id)).waiting is None
    assert set_job_waiting(session, job_id=job.id, owner="r1", waiting=waiting)
    session.expire_all()
    assert job_to_schema(session, get_job(session, job_id=job.id)).waiting == waiting
    finish_job(session, job_id=job.id, owner="r1", status=JobStatus.done)
    session.expire_all()
    assert job_to_schema(session, get_job(session, job_id=job.id)).waiting is None
