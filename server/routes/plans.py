"""POST /v1/plans: check a plan request, then queue a job (runners do the work).

Idempotent: a request sent again with the same `Idempotency-Key` header gets the job the
key first made, and a request identical to one whose job is still queued or running gets
that job (`?new=true` asks for a new one); both answer 200 with `deduplicated: true`.
"""

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header, Query, Response, status
from pydantic import Field, model_validator
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from schemas import PlanRequest
from schemas.cluster import RequestedCluster
from server.admission import check_plan_request
from server.api_models import JobCreated, error_responses
from server.deps import SessionDep
from server.errors import Conflict
from server.examples import PLAN_EXAMPLES
from server.routes.models import store_model
from store import create_job
from store.idempotency import (
    active_job_for_request,
    adopt_idempotency_key,
    job_by_idempotency_key,
    lock_request,
    request_hash,
    set_job_request,
)
from store.tables import JobRow

router = APIRouter(prefix="/v1/plans", tags=["plans"])

IDEMPOTENCY_KEY = "Idempotency-Key"
KEY_PATTERN = r"^[\x21-\x7e]{1,128}$"


class PlanRequestBody(PlanRequest):
    """A `PlanRequest`; the zoo may also be given as `{"zoo": "gpt", "config": {...}}`."""

    cluster: RequestedCluster = Field(default_factory=RequestedCluster, description="The cluster.")

    @model_validator(mode="before")
    @classmethod
    def _short_zoo(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("zoo"), str):
            data = dict(data)
            data["zoo"] = {"name": data["zoo"], "config": data.pop("config", {})}
        return data


DedupReason = Literal["idempotency_key", "identical_request"]


def _answer(
    job: JobRow, response: Response, *, created: bool, by: DedupReason | None = None
) -> JobCreated:
    url = f"/v1/jobs/{job.id}"
    response.headers["Location"] = url
    if not created:
        response.status_code = status.HTTP_200_OK
    return JobCreated(
        job_id=job.id,
        status=job.status,
        model_id=job.model_id,
        url=url,
        dashboard_url=f"/jobs/{job.id}",
        deduplicated=not created,
        deduplicated_by=None if created else by,
    )


def _same_key(job: JobRow, key: str, wanted_hash: str) -> JobRow:
    if job.request_hash != wanted_hash:
        raise Conflict(
            f"{IDEMPOTENCY_KEY} {key!r} was already used for a different request (job "
            f"{job.id}); send a new key for a new request"
        )
    return job


def _keyed_job(session: Session, key: str, wanted_hash: str) -> JobRow | None:
    earlier = job_by_idempotency_key(session, key=key)
    return None if earlier is None else _same_key(earlier, key, wanted_hash)


def _reuse(session: Session, wanted_hash: str, key: str | None) -> JobRow | None:
    """A queued or running job of an equal request; with a key, one no key names yet,
    which the key names from now on (so a retry finds it even after it ends)."""
    active = active_job_for_request(session, request_hash=wanted_hash, keyless=key is not None)
    if active is None or key is None:
        return active
    with session.begin_nested():
        adopted = adopt_idempotency_key(session, job_id=active.id, key=key)
    return active if adopted else None


def _queue(
    session: Session, body: PlanRequestBody, model_id: str | None, wanted_hash: str, key: str | None
) -> JobRow:
    with session.begin_nested():
        if body.model is not None:
            model_id = store_model(session, body.model)[0].id
        job = create_job(
            session,
            cluster=body.cluster,
            options=body.options,
            model_id=model_id,
            zoo_name=body.zoo.name if body.zoo is not None else None,
            zoo_config=dict(body.zoo.config) if body.zoo is not None else None,
        )
        set_job_request(session, job=job, request_hash=wanted_hash, idempotency_key=key)
    return job


def _find_or_queue(
    session: Session,
    body: PlanRequestBody,
    model_id: str | None,
    key: str | None,
    new: bool,
) -> tuple[JobRow, DedupReason | None]:
    """The job that answers the request, and why it is an existing one (None: it is new).
    IntegrityError when a concurrent request took `key` first."""
    wanted_hash = request_hash(
        cluster=body.cluster, options=body.options, model_id=model_id, zoo=body.zoo
    )
    if key is not None:
        earlier = _keyed_job(session, key, wanted_hash)
        if earlier is not None:
            return earlier, "idempotency_key"
    if not new:
        lock_request(session, request_hash=wanted_hash)
        reused = _reuse(session, wanted_hash, key)
        if reused is not None:
            return reused, "identical_request"
    return _queue(session, body, model_id, wanted_hash, key), None


@router.post(
    "",
    response_model=JobCreated,
    status_code=status.HTTP_202_ACCEPTED,
    responses=error_responses(
        400,
        401,
        403,
        404,
        409,
        413,
        415,
        extra={
            200: {
                "model": JobCreated,
                "description": "An existing job (`deduplicated: true`): the one this "
                "Idempotency-Key made, or a queued or running job of an identical request.",
            }
        },
    ),
    summary="Plan a model on a cluster (queues a job)",
)
def submit_plan(
    body: Annotated[PlanRequestBody, Body(openapi_examples=PLAN_EXAMPLES)],
    session: SessionDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias=IDEMPOTENCY_KEY,
            pattern=KEY_PATTERN,
            description="A key of your choice (1-128 printable ASCII characters, e.g. a "
            "UUID): sending the same key again returns the job it first made (200), and "
            "a different request with a used key is refused (409). Keys do not expire.",
        ),
    ] = None,
    new: Annotated[
        bool,
        Query(
            description="Queue a new job even when an identical request's job is queued or "
            "running (by default that job is returned). An Idempotency-Key sent before "
            "still returns its own job."
        ),
    ] = False,
) -> JobCreated:
    """Queue a job for a stored model (`model_id`), an inline spec (`model`, stored too) or
    a zoo model (`zoo`); a runner (`stageprof worker`) claims it. Answers `202` with the
    job's URL; poll it, then fetch `/v1/jobs/{id}/plan`.

    Everything a runner would fail on is checked first and answered with a 422 naming the
    field, before anything is stored: sizes, device memory (1 MiB to 16 TiB), manual
    submeshes (each must divide the cluster), the micro-batch, the layers' programs, and the
    number of stage candidates (layer ranges × submeshes × sharding configs), at most
    `STAGEPROF_MAX_CANDIDATES` (default 20000).

    The rules between fields: exactly one of `model_id`, `model`, `zoo`; `num_microbatches`
    divides `global_batch_size`, and `global_batch_size / num_microbatches` is the model's
    micro-batch (dim 0 of its first input); with `microbatch_search` one job plans every
    count it gives at the global batch and answers with the fastest (`plan.microbatch_options`
    lists each count's best): its counts are unique, 1 to 32 of them, each dividing the
    global batch, the search is `estimate`, and sizes other than the model's own need a
    model traced with a symbolic batch dimension (`client.trace_symbolic_batch`; a zoo model
    is traced so by the runner); `manual_submeshes` is given when `submesh_space`
    is `manual`, each dividing the cluster (one host with a number of devices that divides
    `devices_per_host`, or whole hosts, a number dividing `num_hosts`) and, together, able to
    cover it in at most as many stages as there are layers; each of `measure_stages` has
    `start <= end` and, for a `model` or `model_id`, `end` below the model's number of
    layers (a zoo model's are not checked: the runner ignores a key that is not one of the
    job's candidates); the options leave at least one stage candidate; `zoo.config`'s keys,
    value types and bounds are those of the zoo model `zoo.name`; an inline `model` meets
    the rules of `POST /v1/models`. A `model_id` that is not stored is a 404."""
    model_id = check_plan_request(body, session)
    try:
        job, reason = _find_or_queue(session, body, model_id, idempotency_key, new)
    except IntegrityError:
        if idempotency_key is None:
            raise
        wanted_hash = request_hash(
            cluster=body.cluster, options=body.options, model_id=model_id, zoo=body.zoo
        )
        earlier = _keyed_job(session, idempotency_key, wanted_hash)
        if earlier is None:
            raise Conflict(f"{IDEMPOTENCY_KEY} {idempotency_key!r} is in use; retry") from None
        job, reason = earlier, "idempotency_key"
    return _answer(job, response, created=reason is None, by=reason)
