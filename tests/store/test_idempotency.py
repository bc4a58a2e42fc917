"""Idempotent submission in the store: the server's request hash, lookups, the unique key."""

import pytest
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from schemas import ClusterSpec, PlanOptions, ZooRef
from schemas.cluster import RequestedCluster
from store import JobRow, claim_job, create_job, put_model, request_cancel
from store.idempotency import (
    active_job_for_request,
    adopt_idempotency_key,
    job_by_idempotency_key,
    request_hash,
    set_job_request,
)
from tests.store.factories import tiny_spec

GPT = ZooRef(name="gpt", config={"num_layers": 2})


def _zoo_job(session: Session, digest: str, key: str | None = None) -> JobRow:
    job = create_job(
        session, cluster=ClusterSpec(), options=PlanOptions(), zoo_name="gpt", zoo_config={}
    )
    set_job_request(session, job=job, request_hash=digest, idempotency_key=key)
    return job


def test_the_hash_is_of_the_canonical_request() -> None:
    base = request_hash(cluster=ClusterSpec(), options=PlanOptions(), zoo=GPT)
    assert len(base) == 64
    explicit = PlanOptions(num_microbatches=4, strategies=["data", "megatron", "fsdp"])
    assert request_hash(cluster=RequestedCluster(), options=explicit, zoo=GPT) == base
    changed = [
        request_hash(cluster=ClusterSpec(num_hosts=2), options=PlanOptions(), zoo=GPT),
        request_hash(cluster=ClusterSpec(), options=PlanOptions(num_microbatches=2), zoo=GPT),
        request_hash(
            cluster=ClusterSpec(), options=PlanOptions(), zoo=ZooRef(name="gpt", config={})
        ),
        request_hash(cluster=ClusterSpec(), options=PlanOptions(), model_id="m" * 64),
    ]
    assert len({base, *changed}) == 5


def test_lookups(session: Session) -> None:
    job = _zoo_job(session, "a" * 64, key="k1")
    assert job_by_idempotency_key(session, key="k1") is job
    assert job_by_idempotency_key(session, key="k2") is None
    assert active_job_for_request(session, request_hash="a" * 64) is job
    assert active_job_for_request(session, request_hash="b" * 64) is None


def test_only_queued_or_running_jobs_without_cancel_are_active(session: Session) -> None:
    model, _ = put_model(session, spec=tiny_spec())
    running = create_job(session, model_id=model.id, cluster=ClusterSpec(), options=PlanOptions())
    set_job_request(session, job=running, request_hash="c" * 64, idempotency_key=None)
    assert claim_job(session, owner="r1", lease_seconds=30, job_id=running.id) is not None
    assert active_job_for_request(session, request_hash="c" * 64) is running
    request_cancel(session, job_id=running.id)  # running: flagged, its runner stops it
    assert active_job_for_request(session, request_hash="c" * 64) is None
    queued = _zoo_job(session, "d" * 64)
    request_cancel(session, job_id=queued.id)  # queued: cancelled at once
    assert active_job_for_request(session, request_hash="d" * 64) is None


def test_a_key_names_one_job(session: Session) -> None:
    _zoo_job(session, "e" * 64, key="same")
    with pytest.raises(IntegrityError), session.begin_nested():
        _zoo_job(session, "f" * 64, key="same")
    _zoo_job(session, "e" * 64)  # no key: any number of jobs
    _zoo_job(session, "e" * 64)


def test_a_key_adopts_only_a_job_without_one(session: Session) -> None:
    keyless = _zoo_job(session, "g" * 64)
    keyed = _zoo_job(session, "g" * 64, key="mine")
    assert active_job_for_request(session, request_hash="g" * 64, keyless=True) is keyless
    assert not adopt_idempotency_key(session, job_id=keyed.id, key="theirs")
    with pytest.raises(IntegrityError), session.begin_nested():
        adopt_idempotency_key(session, job_id=keyless.id, key="mine")
    assert adopt_idempotency_key(session, job_id=keyless.id, key="new")
    assert job_by_idempotency_key(session, key="new") is keyless
    assert active_job_for_request(session, request_hash="g" * 64, keyless=True) is None
