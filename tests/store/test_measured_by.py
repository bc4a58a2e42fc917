"""`measured_by` (the processes that measured a stage) is stored, read back and kept on reuse,
on SQLite and Postgres."""

from sqlalchemy import select
from sqlalchemy.orm import Session

from schemas import ClusterSpec, PlanOptions, ProfileStatus, StageKey, StageProfileResult
from store import (
    CandidateIn,
    StageProfileRow,
    add_candidates,
    create_job,
    get_profile,
    job_results,
    pending_fingerprints,
    profile_result,
    put_model,
    record_result,
    reusable_profiles,
    save_profile,
)
from store.queries import ProfileFilter, ProfileSort, profile_page
from tests.store.factories import profile, tiny_spec

TWO_HOSTS = ("a1b2c3d4e5f6:4242", "0f9e8d7c6b5a:4250")
OTHER = ("ffffffffffff:1", "eeeeeeeeeeee:2")
KEY = StageKey(start=0, end=1, submesh_id=0, config_id=0)


def measured(
    fingerprint: str, by: tuple[str, ...], status: ProfileStatus = ProfileStatus.ok
) -> StageProfileResult:
    return profile(fingerprint, status, key=KEY).model_copy(update={"measured_by": by})


def stored_column(session: Session, fingerprint: str) -> list[str]:
    """The column as the database holds it (not the session's cached object)."""
    session.expire_all()
    stmt = select(StageProfileRow.measured_by).where(StageProfileRow.fingerprint == fingerprint)
    return session.scalars(stmt).one()


def test_round_trip(session: Session) -> None:
    save_profile(session, result=measured("mb-two", TWO_HOSTS))
    save_profile(session, result=measured("mb-one", ("local:77",)))
    save_profile(session, result=measured("mb-none", ()))
    assert stored_column(session, "mb-two") == list(TWO_HOSTS)
    assert stored_column(session, "mb-one") == ["local:77"]
    assert stored_column(session, "mb-none") == []
    row = get_profile(session, fingerprint="mb-two")
    assert row is not None
    assert profile_result(row).measured_by == TWO_HOSTS
    assert profile_result(row) == measured("mb-two", TWO_HOSTS)


def test_first_stored_keeps_its_measured_by_and_transient_failures_are_replaced(
    session: Session,
) -> None:
    save_profile(session, result=measured("mb-first", TWO_HOSTS))
    row = save_profile(session, result=measured("mb-first", OTHER))
    assert profile_result(row).measured_by == TWO_HOSTS
    assert stored_column(session, "mb-first") == list(TWO_HOSTS)

    save_profile(session, result=measured("mb-lost", OTHER, ProfileStatus.worker_lost))
    row = save_profile(session, result=measured("mb-lost", TWO_HOSTS))
    assert profile_result(row).measured_by == TWO_HOSTS
    assert stored_column(session, "mb-lost") == list(TWO_HOSTS)


def _job(session: Session, model_id: str, fingerprint: str) -> str:
    job = create_job(session, model_id=model_id, cluster=ClusterSpec(), options=PlanOptions())
    add_candidates(
        session,
        job_id=job.id,
        model_id=model_id,
        candidates=[CandidateIn(KEY, fingerprint, 1, "data")],
    )
    return job.id


def test_reused_profile_says_where_it_was_measured(session: Session) -> None:
    model, _ = put_model(session, spec=tiny_spec())
    first = _job(session, model.id, "mb-shared")
    row = save_profile(session, result=measured("mb-shared", TWO_HOSTS))
    record_result(session, job_id=first, profile=row, reused=False)

    # The second job reuses it the way the runner does; a late measurement of its own (by
    # other processes) does not replace the stored one.
    second = _job(session, model.id, "mb-shared")
    session.expire_all()
    stored = reusable_profiles(session, fingerprints=pending_fingerprints(session, job_id=second))
    assert set(stored) == {"mb-shared"}
    record_result(session, job_id=second, profile=stored["mb-shared"], reused=True)
    save_profile(session, result=measured("mb-shared", OTHER))
    session.expire_all()

    assert job_results(session, job_id=second)[KEY.as_tuple()].measured_by == TWO_HOSTS
    assert job_results(session, job_id=first)[KEY.as_tuple()].measured_by == TWO_HOSTS
    page = profile_page(session, filters=ProfileFilter(job_id=second), sort=ProfileSort())
    assert [(r["reused"], r["measured_by"]) for r in page.rows] == [(True, list(TWO_HOSTS))]


def test_pending_candidate_has_no_measured_by(session: Session) -> None:
    model, _ = put_model(session, spec=tiny_spec())
    job_id = _job(session, model.id, "mb-pending")
    page = profile_page(session, filters=ProfileFilter(job_id=job_id), sort=ProfileSort())
    assert [r["measured_by"] for r in page.rows] == [None]
