"""Idempotent submission: a job by its client's Idempotency-Key or by an equal request.

The request hash is computed here, from the canonical request (the model's content id or
the zoo reference, the cluster and the options with their defaults filled in), never taken
from the client.
"""

import hashlib
import json
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from schemas import ClusterSpec, JobStatus, PlanOptions, ZooRef
from store.engine import is_postgres
from store.tables import JobRow

ACTIVE = (JobStatus.queued.value, JobStatus.profiling.value, JobStatus.planning.value)


def request_hash(
    *,
    cluster: ClusterSpec,
    options: PlanOptions,
    model_id: str | None = None,
    zoo: ZooRef | None = None,
) -> str:
    """sha256 of the canonical plan request; equal requests have equal hashes."""
    canonical: dict[str, Any] = {
        "model_id": model_id,
        "zoo": zoo.model_dump(mode="json") if zoo is not None else None,
        "cluster": cluster.model_dump(mode="json"),
        "options": options.model_dump(mode="json"),
    }
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def lock_request(session: Session, *, request_hash: str) -> None:
    """Serialize equal requests until this transaction ends, so that of several identical
    requests racing, one queues the job and the others find it. SQLite needs nothing: a
    write request holds the database's write lock from its first statement."""
    if is_postgres(session):
        key = int(request_hash[:15], 16)  # 60 bits: a positive bigint
        session.execute(select(func.pg_advisory_xact_lock(key)))


def job_by_idempotency_key(session: Session, *, key: str) -> JobRow | None:
    """The job submitted with `key`, whatever its status."""
    return session.scalars(select(JobRow).where(JobRow.idempotency_key == key)).first()


def active_job_for_request(
    session: Session, *, request_hash: str, keyless: bool = False
) -> JobRow | None:
    """The oldest queued or running job (cancel not requested) made by an equal request;
    with `keyless`, only among jobs that no Idempotency-Key names yet."""
    stmt = select(JobRow).where(
        JobRow.request_hash == request_hash,
        JobRow.status.in_(ACTIVE),
        JobRow.cancel_requested.is_(False),
    )
    if keyless:
        stmt = stmt.where(JobRow.idempotency_key.is_(None))
    return session.scalars(stmt.order_by(JobRow.created_at, JobRow.id).limit(1)).first()


def adopt_idempotency_key(session: Session, *, job_id: str, key: str) -> bool:
    """Name a job that has no key yet by `key` (a request with a new key was answered with
    it); False when another key named it first. IntegrityError when `key` names another."""
    result = session.execute(
        update(JobRow)
        .where(JobRow.id == job_id, JobRow.idempotency_key.is_(None))
        .values(idempotency_key=key)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1  # type: ignore[attr-defined]


def set_job_request(
    session: Session, *, job: JobRow, request_hash: str, idempotency_key: str | None
) -> None:
    """Record how `job` was requested (flushes: a key already taken raises IntegrityError)."""
    job.request_hash = request_hash
    job.idempotency_key = idempotency_key
    session.flush()
