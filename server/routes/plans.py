"""POST /v1/plans: validate a plan request and queue a job (runners do the work)."""

from typing import Annotated, Any

from fastapi import APIRouter, Body, Response, status
from pydantic import model_validator

from schemas import PlanRequest
from server.api_models import JobCreated, error_responses
from server.checks import (
    micro_batch_errors,
    program_errors,
    raise_if,
    storable_errors,
    submesh_errors,
    zoo_ref_errors,
)
from server.deps import SessionDep
from server.errors import Conflict, NotFound
from server.examples import PLAN_EXAMPLES
from server.routes.models import store_model
from store import OldModelForm, create_job, get_model_row, is_current_form

router = APIRouter(prefix="/v1/plans", tags=["plans"])


class PlanRequestBody(PlanRequest):
    """A `PlanRequest`; the zoo may also be given as `{"zoo": "gpt", "config": {...}}`."""

    @model_validator(mode="before")
    @classmethod
    def _short_zoo(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("zoo"), str):
            data = dict(data)
            data["zoo"] = {"name": data["zoo"], "config": data.pop("config", {})}
        return data


def _stored_micro_batch(skeleton: dict[str, Any]) -> int:
    shape = skeleton["inputs"][0]["shape"]
    return shape[0] if shape else 1


@router.post(
    "",
    response_model=JobCreated,
    status_code=status.HTTP_202_ACCEPTED,
    responses=error_responses(400, 401, 403, 404, 409, 413, 415),
    summary="Plan a model on a cluster (queues a job)",
)
def submit_plan(
    body: Annotated[PlanRequestBody, Body(openapi_examples=PLAN_EXAMPLES)],
    session: SessionDep,
    response: Response,
) -> JobCreated:
    """Queue a job for a stored model (`model_id`), an inline spec (`model`, stored too) or
    a zoo model (`zoo`); a runner (`stageprof worker`) claims it. Answers `202` with the
    job's URL; poll it, then fetch `/v1/jobs/{id}/plan`."""
    errors = storable_errors(body, ("body",))
    errors += submesh_errors(body.options, body.cluster, ("body", "options"))
    if body.zoo is not None:
        errors += zoo_ref_errors(body.zoo, ("body", "zoo"))
    if body.model is not None:
        errors += program_errors(body.model, ("body", "model"))
        mb = body.model.micro_batch_size
        errors += micro_batch_errors(body.options, mb, ("body", "options"))
    raise_if(errors)

    model_id = body.model_id
    if model_id is not None:
        row = get_model_row(session, model_id=model_id)
        if row is None:
            raise NotFound(f"model {model_id!r} not found; POST it to /v1/models first")
        if not is_current_form(row.spec):
            raise Conflict(str(OldModelForm(model_id)))
        mb = _stored_micro_batch(row.spec)
        raise_if(micro_batch_errors(body.options, mb, ("body", "options")))
    elif body.model is not None:
        model_id = store_model(session, body.model)[0].id
    job = create_job(
        session,
        cluster=body.cluster,
        options=body.options,
        model_id=model_id,
        zoo_name=body.zoo.name if body.zoo is not None else None,
        zoo_config=dict(body.zoo.config) if body.zoo is not None else None,
    )
    url = f"/v1/jobs/{job.id}"
    response.headers["Location"] = url
    return JobCreated(
        job_id=job.id,
        status=job.status,
        model_id=model_id,
        url=url,
        dashboard_url=f"/jobs/{job.id}",
    )
