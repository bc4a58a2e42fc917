"""The dashboard: server-rendered pages (Jinja2, autoescaped) with small vanilla JS/SVG.

Every asset comes from /static; the pages read live data from the /v1 API.
"""

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session

from schemas import JobStatus
from schemas.plan import STABILITY_LABELS, percent
from schemas.trainer_export import maxtext_gap
from server.deps import SessionDep
from server.routes.models import layer_infos
from store import (
    JobRow,
    get_job,
    get_model_row,
    job_plan,
    job_to_schema,
    list_jobs,
    list_models,
)
from store.queries import jobs_for_model, layer_jaxprs

router = APIRouter(include_in_schema=False)
TEMPLATES = Jinja2Templates(directory=str(Path(__file__).resolve().parent.parent / "templates"))


def fmt_seconds(v: float | None) -> str:
    """0.00123 -> '1.23 ms'; None -> '–'."""
    if v is None:
        return "–"
    if v == 0:
        return "0"
    if v >= 1:
        return f"{v:.3g} s"
    if v >= 1e-3:
        return f"{v * 1e3:.3g} ms"
    return f"{v * 1e6:.3g} µs"


def fmt_bytes(v: float | None) -> str:
    if v is None:
        return "–"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= size:
            return f"{v / size:.3g} {unit}"
    return f"{int(v)} B"


def fmt_time(v: Any) -> str:
    return v.strftime("%Y-%m-%d %H:%M:%S UTC") if v is not None else "–"


TEMPLATES.env.filters.update(seconds=fmt_seconds, bytes=fmt_bytes, when=fmt_time, percent=percent)
TEMPLATES.env.globals.update(stability_labels=STABILITY_LABELS)


def _page(request: Request, name: str, context: dict[str, Any], status: int = 200):
    settings = request.app.state.settings
    data = {"poll_ms": settings.poll_interval_ms, **context.pop("page_data", {})}
    return TEMPLATES.TemplateResponse(
        request, name, {**context, "page_data": data}, status_code=status
    )


def _not_found(request: Request, what: str) -> HTMLResponse:
    return _page(request, "error.html", {"title": "Not found", "message": what}, status=404)


@router.get("/", response_class=HTMLResponse)
def jobs_page(request: Request, session: SessionDep) -> HTMLResponse:
    jobs = [job_to_schema(session, r) for r in list_jobs(session, limit=50)]
    models = list_models(session, limit=20)
    return _page(request, "jobs.html", {"jobs": jobs, "models": models})


def job_page_context(session: Session, row: JobRow) -> dict[str, Any]:
    """What job.html (and the standalone report) render: the job, its plan, the layer names,
    and `page_data`, the JSON the page's scripts read (schedule, plan stages, strategies)."""
    job = job_to_schema(session, row)
    plan = job_plan(row)
    layer_names: list[str] = []
    if row.model_id is not None:
        model = get_model_row(session, model_id=row.model_id)
        if model is not None:
            layer_names = [layer["name"] for layer in model.spec["layers"]]
    page_data = {
        "job_id": job.id,
        "finished": JobStatus(job.status).finished,
        "status": job.status.value,
        "schedule": [e.model_dump() for e in plan.schedule] if plan else [],
        "num_stages": len(plan.stages) if plan else 0,
        "stages": [
            {"start": s.start, "end": s.end, "submesh_id": s.submesh_id, "config_id": s.config_id}
            for s in (plan.stages if plan else [])
        ],
        "strategies": sorted(job.options.strategies),
    }
    summary = maxtext_gap(plan.maxtext) if plan is not None and plan.maxtext else None
    return {
        "job": job,
        "plan": plan,
        "layer_names": layer_names,
        "page_data": page_data,
        "maxtext_summary": summary,
    }


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: str, request: Request, session: SessionDep) -> HTMLResponse:
    row = get_job(session, job_id=job_id)
    if row is None:
        return _not_found(request, f"There is no job {job_id!r}.")
    return _page(request, "job.html", job_page_context(session, row))


@router.get("/models/{model_id}", response_class=HTMLResponse)
def model_page(model_id: str, request: Request, session: SessionDep) -> HTMLResponse:
    row = get_model_row(session, model_id=model_id)
    if row is None:
        return _not_found(request, f"There is no model {model_id!r}.")
    layers = layer_infos(row.spec)
    jaxprs = layer_jaxprs(session, fingerprints=[layer.fingerprint for layer in layers])
    context = {
        "model": row,
        "spec": row.spec,
        "layers": layers,
        "jaxprs": jaxprs,
        "jobs": [job_to_schema(session, r) for r in jobs_for_model(session, model_id=row.id)],
    }
    return _page(request, "model.html", context)


@router.get("/api", response_class=HTMLResponse)
def api_page(request: Request) -> HTMLResponse:
    """A plain index of the API's operations (the OpenAPI document is at /openapi.json)."""
    schema = request.app.openapi()
    ops = [
        {"method": method.upper(), "path": path, "summary": op.get("summary", "")}
        for path, item in schema["paths"].items()
        for method, op in item.items()
    ]
    return _page(request, "api.html", {"ops": ops, "version": schema["info"]["version"]})
