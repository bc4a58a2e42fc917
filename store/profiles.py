"""Stage profiles (one row per stage fingerprint) and the candidates of each job."""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, bindparam, insert, literal, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from schemas import ProfileStatus, StageKey, StageProfileResult
from store.base import utcnow
from store.engine import is_postgres
from store.tables import ESTIMATED, PRUNED, JobCandidateRow, StageProfileRow

# Failures that depend on the moment, not on the stage: measured again by a later job.
TRANSIENT_STATUSES = (
    ProfileStatus.timeout.value,
    ProfileStatus.worker_lost.value,
    ProfileStatus.runtime_error.value,
)
REUSABLE_STATUSES = tuple(s.value for s in ProfileStatus if s.value not in TRANSIENT_STATUSES)
_OOM = ProfileStatus.oom.value
_MEASURED_WITH = StageProfileRow.result["available_memory"].as_float()


def answers(row: StageProfileRow, device_memory: int | None = None) -> bool:
    """Whether a stored result answers a job whose devices have `device_memory` bytes: not a
    transient failure, and not an `oom` found with less memory than that job has (judged
    against the measuring job's devices; the asking job's may fit it). None: any job."""
    if row.status in TRANSIENT_STATUSES:
        return False
    if row.status != _OOM or device_memory is None:
        return True
    measured_with = (row.result or {}).get("available_memory")
    return isinstance(measured_with, int) and measured_with >= device_memory


def _answers_sql(device_memory: int | None) -> ColumnElement[bool]:
    """`answers` as a condition on `stage_profiles` rows."""
    usable = StageProfileRow.status.in_(REUSABLE_STATUSES)
    if device_memory is None:
        return usable
    enough = _MEASURED_WITH >= literal(float(device_memory))
    return usable & or_(StageProfileRow.status != _OOM, enough)


@dataclass(frozen=True)
class CandidateIn:
    """A candidate to add to a job: its key, stage fingerprint and what it runs on;
    `micro_batch_size`: the size it runs at in a job that searches counts (0: one count)."""

    key: StageKey
    fingerprint: str
    num_devices: int
    strategy: str
    micro_batch_size: int = 0


def _profile_values(result: StageProfileResult) -> dict[str, Any]:
    ok = result.ok
    return {
        "fingerprint": result.fingerprint,
        "status": result.status.value,
        "compute_cost": result.compute_cost if ok else None,
        "forward_cost": result.forward_cost if ok else None,
        "backward_cost": result.backward_cost if ok else None,
        "peak_memory": result.peak_memory,
        "pipeline_peak_memory": result.pipeline_peak_memory,
        "initial_var_size": result.initial_var_size,
        "intermediate_size": result.intermediate_size,
        "max_n_succ_stages": result.max_n_succ_stages,
        "num_layers": result.num_layers,
        "submesh_hosts": result.submesh.hosts,
        "submesh_devices": result.submesh.devices_per_host,
        "mesh_dp": result.config.logical_mesh[0],
        "mesh_tp": result.config.logical_mesh[1],
        "strategy": result.config.strategy,
        "device_kind": result.device_kind,
        "jax_version": result.jax_version,
        "measured_by": list(result.measured_by),
        "compile_seconds": result.compile_seconds,
        "error": result.error,
        "result": result.model_dump(mode="json"),
        "created_at": utcnow(),
    }


def save_profile(session: Session, *, result: StageProfileResult) -> StageProfileRow:
    """Store a measurement; concurrent saves of one fingerprint keep one row.

    A stored transient failure (timeout, worker lost, runtime error) is replaced by a new
    result, and so is an `oom` found with less device memory than `result` was measured
    with (a job with bigger devices measured it again); anything else stored first wins.
    """
    values = _profile_values(result)
    dialect_insert = pg_insert if is_postgres(session) else sqlite_insert
    stmt = dialect_insert(StageProfileRow).values(**values)
    replaceable = StageProfileRow.status.in_(TRANSIENT_STATUSES)
    if result.status.value not in TRANSIENT_STATUSES:
        smaller = _MEASURED_WITH < literal(float(result.available_memory))
        replaceable = replaceable | ((StageProfileRow.status == _OOM) & smaller)
    stmt = stmt.on_conflict_do_update(
        index_elements=[StageProfileRow.fingerprint],
        set_={k: stmt.excluded[k] for k in values if k != "fingerprint"},
        where=replaceable,
    )
    session.execute(stmt)
    row = session.scalars(
        select(StageProfileRow)
        .where(StageProfileRow.fingerprint == result.fingerprint)
        .execution_options(populate_existing=True)
    ).one()
    return row


def get_profile(session: Session, *, fingerprint: str) -> StageProfileRow | None:
    stmt = select(StageProfileRow).where(StageProfileRow.fingerprint == fingerprint)
    return session.scalars(stmt).first()


def reusable_profiles(
    session: Session, *, fingerprints: Iterable[str], device_memory: int | None = None
) -> dict[str, StageProfileRow]:
    """Stored profiles that a job whose devices have `device_memory` bytes may reuse instead
    of measuring (`answers`: not transient failures, no `oom` found on smaller devices)."""
    wanted = list(set(fingerprints))
    found: dict[str, StageProfileRow] = {}
    for i in range(0, len(wanted), 500):
        stmt = select(StageProfileRow).where(
            StageProfileRow.fingerprint.in_(wanted[i : i + 500]),
            _answers_sql(device_memory),
        )
        found.update((row.fingerprint, row) for row in session.scalars(stmt))
    return found


def profile_result(row: StageProfileRow) -> StageProfileResult:
    """The stored measurement as it was saved, `measured_by` included (the columns beside
    `result` are copies of its fields for the profile table)."""
    return StageProfileResult.model_validate(row.result)


def add_candidates(
    session: Session, *, job_id: str, model_id: str | None, candidates: Iterable[CandidateIn]
) -> int:
    """Add a job's candidates; those already there (a resumed job) are kept as they are."""
    existing = {
        tuple(r)
        for r in session.execute(
            select(
                JobCandidateRow.start,
                JobCandidateRow.end,
                JobCandidateRow.submesh_id,
                JobCandidateRow.config_id,
                JobCandidateRow.micro_batch_size,
            ).where(JobCandidateRow.job_id == job_id)
        )
    }
    rows = [
        {
            "job_id": job_id,
            "model_id": model_id,
            "start": c.key.start,
            "end": c.key.end,
            "submesh_id": c.key.submesh_id,
            "config_id": c.key.config_id,
            "micro_batch_size": c.micro_batch_size,
            "num_devices": c.num_devices,
            "strategy": c.strategy,
            "fingerprint": c.fingerprint,
        }
        for c in candidates
        if (*c.key.as_tuple(), c.micro_batch_size) not in existing
    ]
    if rows:
        session.execute(insert(JobCandidateRow), rows)
    return len(rows)


def pending_fingerprints(
    session: Session, *, job_id: str, micro_batch_size: int | None = None
) -> list[str]:
    """Fingerprints of the job's candidates that have no result yet, largest submesh first
    (those at `micro_batch_size` only, when given)."""
    stmt = (
        select(JobCandidateRow.fingerprint, JobCandidateRow.num_devices)
        .where(
            JobCandidateRow.job_id == job_id,
            JobCandidateRow.profile_id.is_(None),
            JobCandidateRow.status.is_(None),
            *_at_size(micro_batch_size),
        )
        .order_by(JobCandidateRow.num_devices.desc(), JobCandidateRow.id)
    )
    seen: dict[str, None] = {}
    for fp, _ in session.execute(stmt):
        seen.setdefault(fp, None)
    return list(seen)


def _at_size(micro_batch_size: int | None) -> list[Any]:
    """The condition "candidates at this micro-batch size" (none when not given)."""
    if micro_batch_size is None:
        return []
    return [JobCandidateRow.micro_batch_size == micro_batch_size]


def _mark_without_profile(
    session: Session, job_id: str, fingerprints: Iterable[str], status: str, pending_only: bool
) -> int:
    """Give the job's candidates of these fingerprints that have no profile `status` (only
    those with no status yet: `pending_only`); returns how many candidates."""
    wanted = list(fingerprints)
    if not wanted:
        return 0
    conditions = [
        JobCandidateRow.job_id == job_id,
        JobCandidateRow.fingerprint.in_(wanted),
        JobCandidateRow.profile_id.is_(None),
    ]
    if pending_only:
        conditions.append(JobCandidateRow.status.is_(None))
    result = session.execute(
        update(JobCandidateRow)
        .where(*conditions)
        .values(status=status, recorded_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def mark_pruned(session: Session, *, job_id: str, fingerprints: Iterable[str]) -> int:
    """Record that the job skips these stages (no profile); returns how many candidates."""
    return _mark_without_profile(session, job_id, fingerprints, PRUNED, pending_only=False)


def mark_estimated(session: Session, *, job_id: str, fingerprints: Iterable[str]) -> int:
    """Record that the job never measured these stages: their numbers are estimates only
    (search: estimate); returns how many candidates."""
    return _mark_without_profile(session, job_id, fingerprints, ESTIMATED, pending_only=True)


def record_estimates(session: Session, *, job_id: str, estimates: Mapping[str, float]) -> int:
    """Store the job's estimate of forward + backward (seconds) of each stage fingerprint on
    its candidates, measured or not (one executemany); returns how many fingerprints."""
    if not estimates:
        return 0
    stmt = (
        update(JobCandidateRow)
        .where(
            JobCandidateRow.job_id == job_id,
            JobCandidateRow.fingerprint == bindparam("fp"),
        )
        .values(estimated_cost=bindparam("seconds"))
        .execution_options(synchronize_session=False)
    )
    rows = [{"fp": fp, "seconds": float(v)} for fp, v in estimates.items()]
    session.connection().execute(stmt, rows)
    return len(rows)


def record_result(
    session: Session,
    *,
    job_id: str,
    profile: StageProfileRow,
    reused: bool,
    fingerprint: str | None = None,
) -> int:
    """Attach `profile` to every candidate of the job with its fingerprint (or with
    `fingerprint`: a stored superset of the measurement the candidates need, such as one with
    the backward split reused by a job that does not need the split); returns how many."""
    result = session.execute(
        update(JobCandidateRow)
        .where(
            JobCandidateRow.job_id == job_id,
            JobCandidateRow.fingerprint == (fingerprint or profile.fingerprint),
            JobCandidateRow.profile_id.is_(None),
            JobCandidateRow.status.is_(None),
        )
        .values(
            profile_id=profile.id,
            reused=reused,
            status=profile.status,
            compute_cost=profile.compute_cost,
            peak_memory=profile.peak_memory,
            recorded_at=utcnow(),
        )
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def forget_results(session: Session, *, job_id: str, fingerprints: Sequence[str]) -> int:
    """Detach the recorded measurement of the job's candidates of `fingerprints` (a stage
    measured without the split backward, about to be measured with it); returns how many."""
    if not fingerprints:
        return 0
    result = session.execute(
        update(JobCandidateRow)
        .where(
            JobCandidateRow.job_id == job_id,
            JobCandidateRow.fingerprint.in_(list(fingerprints)),
        )
        .values(
            profile_id=None,
            reused=False,
            status=None,
            compute_cost=None,
            peak_memory=None,
            recorded_at=None,
        )
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def job_results(
    session: Session, *, job_id: str, micro_batch_size: int | None = None
) -> Mapping[tuple[int, int, int, int], StageProfileResult]:
    """Every recorded candidate of a job with its measurement, by key tuple (those at
    `micro_batch_size` only, when given: a job that searches counts has a key per size)."""
    stmt = (
        select(
            JobCandidateRow.start,
            JobCandidateRow.end,
            JobCandidateRow.submesh_id,
            JobCandidateRow.config_id,
            StageProfileRow.id,
            StageProfileRow.result,
        )
        .join(StageProfileRow, StageProfileRow.id == JobCandidateRow.profile_id)
        .where(JobCandidateRow.job_id == job_id, *_at_size(micro_batch_size))
    )
    cache: dict[int, StageProfileResult] = {}
    out: dict[tuple[int, int, int, int], StageProfileResult] = {}
    for s, e, m, c, profile_id, result in session.execute(stmt):
        if profile_id not in cache:
            cache[profile_id] = StageProfileResult.model_validate(result)
        out[(s, e, m, c)] = cache[profile_id]
    return out
