"""Jobs: create, claim with a lease, heartbeat, progress, finish, cancel."""

import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from schemas import ClusterSpec, Job, JobStatus, Plan, PlanOptions, Progress, ZooRef
from store.base import utcnow
from store.counters import add_counts
from store.engine import is_postgres
from store.tables import ESTIMATED, PRUNED, JobCandidateRow, JobRow, ModelRow

RUNNING = (JobStatus.profiling.value, JobStatus.planning.value)
FINISHED = (JobStatus.done.value, JobStatus.failed.value, JobStatus.cancelled.value)


def create_job(
    session: Session,
    *,
    cluster: ClusterSpec,
    options: PlanOptions,
    model_id: str | None = None,
    zoo_name: str | None = None,
    zoo_config: dict[str, Any] | None = None,
) -> JobRow:
    """A queued job for a stored model, or for a zoo model the runner builds."""
    if (model_id is None) == (zoo_name is None):
        raise ValueError("give exactly one of model_id and zoo_name")
    row = JobRow(
        id=uuid.uuid4().hex,
        model_id=model_id,
        zoo_name=zoo_name,
        zoo_config=zoo_config if zoo_name is not None else None,
        status=JobStatus.queued.value,
        cluster=cluster.model_dump(mode="json"),
        options=options.model_dump(mode="json"),
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row


def get_job(session: Session, *, job_id: str) -> JobRow | None:
    return session.get(JobRow, job_id)


def list_jobs(
    session: Session, *, status: JobStatus | None = None, limit: int = 50, before: str | None = None
) -> list[JobRow]:
    """Newest first; `before` is a job id to page after."""
    stmt = select(JobRow)
    if status is not None:
        stmt = stmt.where(JobRow.status == status.value)
    if before is not None:
        anchor = session.get(JobRow, before)
        if anchor is not None:
            stmt = stmt.where(
                or_(
                    JobRow.created_at < anchor.created_at,
                    and_(JobRow.created_at == anchor.created_at, JobRow.id < anchor.id),
                )
            )
    stmt = stmt.order_by(JobRow.created_at.desc(), JobRow.id.desc()).limit(limit)
    return list(session.scalars(stmt))


def count_jobs_by_status(session: Session) -> dict[str, int]:
    stmt = select(JobRow.status, func.count()).group_by(JobRow.status)
    return {status: n for status, n in session.execute(stmt)}


def claim_job(
    session: Session, *, owner: str, lease_seconds: float, job_id: str | None = None
) -> JobRow | None:
    """Take a queued job, or a running one whose lease expired, for `owner`.

    Safe with several runners: `FOR UPDATE SKIP LOCKED` on Postgres; on SQLite (one
    writer) a compare-and-set update that only one claimer can win.
    """
    now = utcnow()
    claimable = or_(
        JobRow.status == JobStatus.queued.value,
        and_(JobRow.status.in_(RUNNING), JobRow.lease_expires_at < now),
    )
    stmt = select(JobRow).where(claimable, JobRow.cancel_requested.is_(False))
    if job_id is not None:
        stmt = stmt.where(JobRow.id == job_id)
    stmt = stmt.order_by(JobRow.created_at, JobRow.id).limit(1)
    if is_postgres(session):
        stmt = stmt.with_for_update(skip_locked=True)
    # Fresh values: the compare-and-set below must see the lease as stored, not as cached.
    row = session.scalars(stmt.execution_options(populate_existing=True)).first()
    if row is None:
        return None
    same_lease = (
        JobRow.lease_owner.is_(None)
        if row.lease_owner is None
        else JobRow.lease_owner == row.lease_owner
    )
    same_expiry = (
        JobRow.lease_expires_at.is_(None)
        if row.lease_expires_at is None
        else JobRow.lease_expires_at == row.lease_expires_at
    )
    values: dict[str, Any] = {
        "lease_owner": owner,
        "lease_expires_at": now + timedelta(seconds=lease_seconds),
        "attempts": JobRow.attempts + 1,
    }
    if row.status == JobStatus.queued.value:
        values.update(status=JobStatus.profiling.value, started_at=now)
    result = session.execute(
        update(JobRow)
        .where(JobRow.id == row.id, JobRow.status == row.status, same_lease, same_expiry)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return None
    session.refresh(row)
    return row


def renew_lease(session: Session, *, job_id: str, owner: str, lease_seconds: float) -> bool:
    """Extend `owner`'s lease. False when the lease was lost, or the job was cancelled or ended."""
    result = session.execute(
        update(JobRow)
        .where(
            JobRow.id == job_id,
            JobRow.lease_owner == owner,
            JobRow.status.in_(RUNNING),
            JobRow.cancel_requested.is_(False),
        )
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_seconds))
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1  # type: ignore[attr-defined]


def release_lease(session: Session, *, job_id: str, owner: str) -> bool:
    """Hand a running job back (its runner is shutting down): its lease expires now, so
    another runner takes it over at once, or it is reaped if cancel was requested."""
    result = session.execute(
        update(JobRow)
        .where(JobRow.id == job_id, JobRow.lease_owner == owner, JobRow.status.in_(RUNNING))
        .values(lease_expires_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1  # type: ignore[attr-defined]


def _expired_cancelled(job_id: str | None) -> list[Any]:
    conditions = [
        JobRow.status.in_(RUNNING),
        JobRow.cancel_requested.is_(True),
        or_(JobRow.lease_expires_at.is_(None), JobRow.lease_expires_at < utcnow()),
    ]
    if job_id is not None:
        conditions.append(JobRow.id == job_id)
    return conditions


def cancelled_expired_ids(session: Session, *, job_id: str | None = None) -> list[str]:
    """Running jobs with cancel requested whose lease expired (no runner will end them)."""
    return list(session.scalars(select(JobRow.id).where(*_expired_cancelled(job_id))))


def reap_cancelled_expired(session: Session, *, job_id: str | None = None) -> list[str]:
    """End as `cancelled` every running job (or just `job_id`) with cancel requested whose
    lease expired; the ids reaped, each counted in the `jobs_reaped` counter."""
    reaped = list(
        session.scalars(
            update(JobRow)
            .where(*_expired_cancelled(job_id))
            .values(
                status=JobStatus.cancelled.value,
                error="cancelled by request (its runner was gone)",
                finished_at=utcnow(),
                lease_expires_at=None,
            )
            .returning(JobRow.id)
            .execution_options(synchronize_session=False)
        )
    )
    if reaped:
        add_counts(session, counts={"jobs_reaped": len(reaped)})
    return reaped


def set_job_status(session: Session, *, job_id: str, owner: str, status: JobStatus) -> bool:
    """Move a running job owned by `owner` to another running status."""
    result = session.execute(
        update(JobRow)
        .where(JobRow.id == job_id, JobRow.lease_owner == owner, JobRow.status.in_(RUNNING))
        .values(status=status.value)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1  # type: ignore[attr-defined]


def set_job_model(session: Session, *, job_id: str, model_id: str) -> None:
    """Attach the model a zoo job was built into."""
    session.execute(
        update(JobRow)
        .where(JobRow.id == job_id)
        .values(model_id=model_id)
        .execution_options(synchronize_session=False)
    )


def _update_running(session: Session, job_id: str, owner: str, **values: Any) -> bool:
    """Update a running job's row, only as its lease owner; whether a row was updated."""
    result = session.execute(
        update(JobRow)
        .where(JobRow.id == job_id, JobRow.lease_owner == owner, JobRow.status.not_in(FINISHED))
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0))


def set_job_waiting(session: Session, *, job_id: str, owner: str, waiting: str | None) -> bool:
    """Say what a running job waits for (None: nothing); only its lease owner may."""
    return _update_running(session, job_id, owner, waiting=waiting[:256] if waiting else None)


def set_job_phase(session: Session, *, job_id: str, owner: str, phase: str | None) -> bool:
    """Say what a running job is doing (None: nothing in particular); only its lease owner may."""
    return _update_running(session, job_id, owner, phase=phase[:64] if phase else None)


def finish_job(
    session: Session,
    *,
    job_id: str,
    owner: str | None,
    status: JobStatus,
    plan: Plan | None = None,
    error: str | None = None,
) -> bool:
    """End a job (done, failed or cancelled); only its lease owner may, when `owner` is given."""
    if not status.finished:
        raise ValueError(f"{status} is not a final status")
    conditions = [JobRow.id == job_id, JobRow.status.not_in(FINISHED)]
    if owner is not None:
        conditions.append(JobRow.lease_owner == owner)
    result = session.execute(
        update(JobRow)
        .where(*conditions)
        .values(
            status=status.value,
            plan=plan.model_dump(mode="json") if plan is not None else None,
            error=error,
            waiting=None,
            phase=None,
            finished_at=utcnow(),
            lease_expires_at=None,
        )
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1  # type: ignore[attr-defined]


def request_cancel(session: Session, *, job_id: str) -> JobRow | None:
    """Cancel: a queued job ends at once; a running one is flagged and its runner stops it.

    Returns the job (None when unknown). A finished job is returned unchanged.
    """
    row = session.get(JobRow, job_id)
    if row is None or row.status in FINISHED:
        return row
    if row.status == JobStatus.queued.value:
        finish_job(session, job_id=job_id, owner=None, status=JobStatus.cancelled)
    else:
        session.execute(
            update(JobRow)
            .where(JobRow.id == job_id)
            .values(cancel_requested=True)
            .execution_options(synchronize_session=False)
        )
    session.refresh(row)
    return row


def is_cancel_requested(session: Session, *, job_id: str) -> bool:
    stmt = select(JobRow.cancel_requested).where(JobRow.id == job_id)
    return bool(session.scalar(stmt))


def refresh_progress(session: Session, *, job_id: str) -> Progress:
    """Recount a job's progress from its candidates and store it on the job row: candidates,
    and distinct stages by what became of them (see `schemas.Progress`)."""
    c = JobCandidateRow
    recorded = c.profile_id.is_not(None)
    ok = c.status == "ok"
    stages = func.count(func.distinct(c.fingerprint))
    stmt = select(
        func.count(),
        stages,
        stages.filter(and_(recorded, c.reused.is_(False), ok)),
        stages.filter(and_(recorded, c.reused.is_(True), ok)),
        stages.filter(and_(recorded, c.status != "ok")),
        stages.filter(c.status == PRUNED),
        stages.filter(c.status == ESTIMATED),
    ).where(c.job_id == job_id)
    row = session.execute(stmt).one()
    candidates, distinct, measured, reused, failed, n_pruned, n_estimated = row
    progress = Progress(
        candidates=candidates,
        distinct_stages=distinct,
        measured=measured,
        reused=reused,
        failed=failed,
        pruned=n_pruned,
        estimated=n_estimated,
    )
    session.execute(
        update(JobRow)
        .where(JobRow.id == job_id)
        .values(**progress.model_dump(exclude={"pending"}))
        .execution_options(synchronize_session=False)
    )
    return progress


def progress_of(row: JobRow) -> Progress:
    """The progress stored on a job row."""
    return Progress(
        candidates=row.candidates,
        distinct_stages=row.distinct_stages,
        measured=row.measured,
        reused=row.reused,
        failed=row.failed,
        pruned=row.pruned,
        estimated=row.estimated,
    )


def job_to_schema(session: Session, row: JobRow) -> Job:
    """The API view of a job row."""
    name = ""
    if row.model_id is not None:
        name = session.scalar(select(ModelRow.name).where(ModelRow.id == row.model_id)) or ""
    elif row.zoo_name:
        name = f"zoo:{row.zoo_name}"
    return Job(
        id=row.id,
        model_id=row.model_id,
        zoo=ZooRef(name=row.zoo_name, config=row.zoo_config or {}) if row.zoo_name else None,
        model_name=name,
        status=JobStatus(row.status),
        cluster=ClusterSpec.model_validate(row.cluster),
        options=PlanOptions.model_validate(row.options),
        progress=progress_of(row),
        error=row.error,
        lease_owner=row.lease_owner,
        cancel_requested=row.cancel_requested,
        waiting=row.waiting,
        phase=row.phase if not JobStatus(row.status).finished else None,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        has_plan=row.plan is not None,
    )


def job_plan(row: JobRow) -> Plan | None:
    return Plan.model_validate(row.plan) if row.plan is not None else None
