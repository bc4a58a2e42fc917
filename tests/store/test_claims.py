"""Stage claims (one claimant per fingerprint, leases, takeover), counters, reaping."""

import threading
from datetime import timedelta

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from schemas import ClusterSpec, JobStatus, PlanOptions
from store import JobRow, claim_job, create_job, get_job, put_model, request_cancel, utcnow
from store import session_scope as scope
from store.claims import claim_stage, live_claims, release_claims, renew_claims
from store.counters import add_counts, read_counters
from store.jobs import cancelled_expired_ids, reap_cancelled_expired, release_lease
from store.tables import StageClaimRow
from tests.store.factories import tiny_spec


def test_one_claimant_until_expiry(session: Session) -> None:
    assert claim_stage(session, fingerprint="f1", owner="a", job_id="j1", lease_seconds=30)
    assert not claim_stage(session, fingerprint="f1", owner="b", job_id="j2", lease_seconds=30)
    assert claim_stage(session, fingerprint="f1", owner="a", job_id="j1", lease_seconds=30)
    assert set(live_claims(session, fingerprints=["f1", "f2"])) == {"f1"}
    assert live_claims(session, fingerprints=["f1"], exclude_owner="a") == {}
    session.execute(update(StageClaimRow).values(expires_at=utcnow() - timedelta(seconds=1)))
    assert live_claims(session, fingerprints=["f1"]) == {}
    assert claim_stage(session, fingerprint="f1", owner="b", job_id="j2", lease_seconds=30)
    assert live_claims(session, fingerprints=["f1"])["f1"][0] == "b"


def test_renew_and_release(session: Session) -> None:
    for fp in ("f1", "f2"):
        assert claim_stage(session, fingerprint=fp, owner="a", job_id="j", lease_seconds=1)
    assert claim_stage(session, fingerprint="f3", owner="b", job_id="k", lease_seconds=30)
    assert renew_claims(session, owner="a", lease_seconds=60) == 2
    assert release_claims(session, owner="a", fingerprints=["f1", "f3"]) == 1
    assert set(live_claims(session, fingerprints=["f1", "f2", "f3"])) == {"f2", "f3"}
    assert release_claims(session, owner="a") == 1
    assert release_claims(session, owner="a", fingerprints=[]) == 0


def test_concurrent_claimants_one_wins(committing: sessionmaker[Session]) -> None:
    wins: list[str] = []
    barrier = threading.Barrier(6)

    def claim(owner: str) -> None:
        barrier.wait()
        with scope(committing) as s:
            if claim_stage(s, fingerprint="hot", owner=owner, job_id="j", lease_seconds=30):
                wins.append(owner)

    threads = [threading.Thread(target=claim, args=(f"r{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1


def test_counters_add_up(session: Session) -> None:
    add_counts(session, counts={"db_retries": 2, "job_takeovers": 0})
    add_counts(session, counts={"db_retries": 3, "jobs_reaped": 1})
    assert read_counters(session) == {"db_retries": 5, "jobs_reaped": 1}


def _running_job(session: Session, *, lease_seconds: float) -> JobRow:
    model, _ = put_model(session, spec=tiny_spec())
    create_job(session, model_id=model.id, cluster=ClusterSpec(), options=PlanOptions())
    row = claim_job(session, owner="dead", lease_seconds=lease_seconds)
    assert row is not None
    return row


def test_cancelled_job_without_runner_is_reaped_after_its_lease(session: Session) -> None:
    job = _running_job(session, lease_seconds=30)
    request_cancel(session, job_id=job.id)
    assert reap_cancelled_expired(session) == []  # its runner may still end it
    session.execute(update(JobRow).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    assert cancelled_expired_ids(session) == [job.id]
    assert reap_cancelled_expired(session, job_id="other") == []
    assert reap_cancelled_expired(session, job_id=job.id) == [job.id]
    row = get_job(session, job_id=job.id)
    assert row is not None
    session.refresh(row)
    assert row.status == JobStatus.cancelled.value and row.finished_at is not None
    assert reap_cancelled_expired(session) == []
    assert read_counters(session)["jobs_reaped"] == 1


def test_expired_job_without_cancel_is_not_reaped(session: Session) -> None:
    job = _running_job(session, lease_seconds=30)
    assert release_lease(session, job_id=job.id, owner="someone-else") is False
    assert release_lease(session, job_id=job.id, owner="dead") is True
    assert reap_cancelled_expired(session) == []
    again = claim_job(session, owner="next", lease_seconds=30)
    assert again is not None and again.id == job.id and again.attempts == 2
