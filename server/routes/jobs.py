"""Jobs: list, read, cancel, their plan and their cost matrices."""

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from sqlalchemy.orm import Session

from schemas import TEXT_PATTERN, Job, JobStatus, Plan
from schemas.trainer_export import ExportFormat, ExportUnavailable, export_plan
from server.api_models import CostMatricesOut, CostMatrixOut, JobList, error_responses
from server.checks import raise_if
from server.deps import SessionDep
from server.errors import Conflict, NotFound, field_error
from store import (
    JobRow,
    ModelRow,
    get_job,
    job_plan,
    job_to_schema,
    list_jobs,
    request_cancel,
    session_scope,
)
from store.jobs import cancelled_expired_ids, reap_cancelled_expired
from store.queries import CostMatrix, cost_matrices, job_micro_batch_sizes, job_num_layers

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

MAX_JOBS_PAGE = 200
JobId = Annotated[str, Path(pattern=TEXT_PATTERN, description="The job's id.")]
CANCEL_TEXT = """A queued job is cancelled at once; a running one is flagged and its runner stops it
(the answer shows `cancel_requested: true`). Cancelling a finished job is a 409. The job stays
readable (`GET /v1/jobs/{job_id}` shows it `cancelled`): cancelling deletes nothing."""


def settle_cancelled(request: Request, job_id: str | None = None) -> list[str]:
    """End as `cancelled` the jobs (or `job_id`) whose cancel was asked and whose runner is
    gone (lease expired), so that a read never shows such a job running. A read-only look
    first; the write, in a short transaction of its own, only when there is one."""
    sessions = request.app.state.sessionmaker
    with session_scope(sessions, write=False) as s:
        if not cancelled_expired_ids(s, job_id=job_id):
            return []
    with session_scope(sessions) as s:
        return reap_cancelled_expired(s, job_id=job_id)


def _job_row(session: Session, job_id: str) -> JobRow:
    row = get_job(session, job_id=job_id)
    if row is None:
        raise NotFound(f"job {job_id!r} not found")
    return row


@router.get(
    "", response_model=JobList, responses=error_responses(), summary="List jobs, newest first"
)
def read_jobs(
    request: Request,
    session: SessionDep,
    status: JobStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_JOBS_PAGE)] = 50,
    before: Annotated[
        str | None,
        Query(max_length=64, pattern=TEXT_PATTERN, description="A job id to page after."),
    ] = None,
) -> JobList:
    settle_cancelled(request)
    rows = list_jobs(session, status=status, limit=limit + 1, before=before)
    more = len(rows) > limit
    rows = rows[:limit]
    return JobList(
        items=[job_to_schema(session, r) for r in rows],
        next_before=rows[-1].id if more and rows else None,
    )


@router.get(
    "/{job_id}",
    response_model=Job,
    responses=error_responses(404),
    summary="A job: status, progress, timings, error",
)
def read_job(job_id: JobId, request: Request, session: SessionDep) -> Job:
    """A cancelled job whose runner is gone reads as `cancelled` once its lease expired."""
    settle_cancelled(request, job_id)
    return job_to_schema(session, _job_row(session, job_id))


@router.post(
    "/{job_id}/cancel",
    response_model=Job,
    responses=error_responses(403, 404, 409, 413, 415),
    summary="Cancel a job",
    description=CANCEL_TEXT,
)
def request_job_cancel(job_id: JobId, session: SessionDep) -> Job:
    return _cancel(session, job_id)


@router.delete(
    "/{job_id}",
    response_model=Job,
    responses=error_responses(403, 404, 409),
    summary="Cancel a job (the older form of POST /v1/jobs/{job_id}/cancel)",
    description=CANCEL_TEXT + "\n\nKept for older clients: it cancels, it does not delete.",
    deprecated=True,
)
def cancel_job(job_id: JobId, session: SessionDep) -> Job:
    return _cancel(session, job_id)


def _cancel(session: Session, job_id: str) -> Job:
    row = _job_row(session, job_id)
    if JobStatus(row.status).finished:
        raise Conflict(f"job {job_id} is already {row.status}")
    cancelled = request_cancel(session, job_id=job_id)
    assert cancelled is not None
    return job_to_schema(session, cancelled)


@router.get(
    "/{job_id}/plan",
    response_model=Plan,
    responses=error_responses(404, 409),
    summary="The job's plan",
)
def read_plan(
    job_id: JobId,
    session: SessionDep,
    format: Annotated[
        ExportFormat | None,
        Query(
            description="The plan in a trainer's form (the same text as `stageprof export`): "
            "json (the plan), alpa (ManualStageOption), maxtext (settings; only for a plan "
            "made for MaxText, else 409), jaxpp (stage marks and schedule). Omitted: the plan."
        ),
    ] = None,
) -> Plan | Response:
    """409 until the job is done (and for a failed or cancelled job, with its error)."""
    row = _job_row(session, job_id)
    plan = job_plan(row)
    if plan is None:
        why = f": {row.error}" if row.error else ""
        raise Conflict(f"job {job_id} has no plan (status {row.status}){why}")
    if format is None:
        return plan
    try:
        text = export_plan(plan, format)
    except ExportUnavailable as err:
        raise Conflict(f"job {job_id}: {err}") from err
    return Response(content=text, media_type="application/json")


def _label(m: CostMatrix) -> str:
    mesh = f"{m.submesh[0]}x{m.submesh[1]}" if m.submesh else f"{m.num_devices} dev"
    logical = f" {m.logical_mesh[0]}x{m.logical_mesh[1]}" if m.logical_mesh else ""
    return f"submesh {m.submesh_id} ({mesh}) / config {m.config_id}:{logical} {m.strategy}"


@router.get(
    "/{job_id}/cost-matrix",
    response_model=CostMatricesOut,
    responses=error_responses(404),
    summary="Stage cost by (start, end) for each submesh and config (the heatmap)",
)
def read_cost_matrix(
    job_id: JobId,
    session: SessionDep,
    submesh_id: Annotated[
        int | None, Query(ge=0, le=2**31 - 1, description="Only this submesh.")
    ] = None,
    config_id: Annotated[
        int | None, Query(ge=0, le=2**31 - 1, description="Only this config.")
    ] = None,
    micro_batch_size: Annotated[
        int | None,
        Query(
            ge=1,
            le=2**31 - 1,
            description="A job that searched counts of micro-batches: the matrices at this "
            "size (default: the plan's).",
        ),
    ] = None,
) -> CostMatricesOut:
    """`compute_cost[start][end]` in seconds (null where missing, pending, failed or estimated
    only), `estimated_cost[start][end]` (the job's estimates) and `status[start][end]`, for
    every (submesh_id, config_id) of the job or the ones asked; in a job that searched
    counts of micro-batches, those of one micro-batch size."""
    return cost_matrices_out(
        session,
        _job_row(session, job_id),
        submesh_id=submesh_id,
        config_id=config_id,
        micro_batch_size=micro_batch_size,
    )


def _shown_size(session: Session, row: JobRow, asked: int | None) -> tuple[int | None, list[int]]:
    """The micro-batch size whose matrices are shown and every size the job searched (none
    for a job of one count); a size the job did not search is a 422."""
    sizes = [s for s in job_micro_batch_sizes(session, job_id=row.id) if s > 0]
    if asked is not None and asked not in sizes:
        searched = f"it searched {sizes}" if sizes else "it planned one count"
        raise_if(
            [field_error(("query", "micro_batch_size"), f"not a size of this job: {searched}")]
        )
    if not sizes:
        return None, []
    planned = (row.plan or {}).get("micro_batch_size")
    default = planned if planned in sizes else max(sizes)
    return (asked if asked is not None else default), sizes


def cost_matrices_out(
    session: Session,
    row: JobRow,
    *,
    submesh_id: int | None = None,
    config_id: int | None = None,
    micro_batch_size: int | None = None,
) -> CostMatricesOut:
    """The cost-matrix answer for a job row (also embedded in the standalone report)."""
    size, sizes = _shown_size(session, row, micro_batch_size)
    n = job_num_layers(session, job_id=row.id)
    names: list[str] = [str(i) for i in range(n)]
    if row.model_id is not None:
        model = session.get(ModelRow, row.model_id)
        if model is not None:
            names = [layer["name"] for layer in model.spec["layers"]]
    return CostMatricesOut(
        job_id=row.id,
        num_layers=n,
        layer_names=names,
        micro_batch_size=size,
        micro_batch_sizes=sizes,
        matrices=[
            CostMatrixOut(
                submesh_id=m.submesh_id,
                config_id=m.config_id,
                num_devices=m.num_devices,
                strategy=m.strategy,
                submesh=m.submesh,
                logical_mesh=m.logical_mesh,
                label=_label(m),
                compute_cost=m.compute_cost,
                estimated_cost=m.estimated_cost,
                status=m.status,
            )
            for m in cost_matrices(
                session,
                job_id=row.id,
                num_layers=n,
                submesh_id=submesh_id,
                config_id=config_id,
                micro_batch_size=size,
            )
        ],
    )
