"""GET /healthz (the database answers) and GET /metrics (Prometheus text)."""

import logging

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from server.api_models import ErrorOut, HealthOut
from server.deps import SessionDep
from server.metrics import PROMETHEUS_CONTENT_TYPE

log = logging.getLogger(__name__)

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    response_model=HealthOut,
    responses={
        400: {"model": ErrorOut, "description": "NUL characters in the URL."},
        503: {"model": HealthOut, "description": "The database does not answer."},
    },
    summary="Liveness and database check",
)
def healthz(request: Request) -> JSONResponse:
    try:
        with request.app.state.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as e:
        log.warning("health check: database unavailable: %s", e)
        return JSONResponse({"status": "unavailable", "database": "unavailable"}, 503)
    return JSONResponse({"status": "ok", "database": "ok"})


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {PROMETHEUS_CONTENT_TYPE: {}}, "description": "Metrics."},
        400: {"model": ErrorOut, "description": "NUL characters in the URL."},
        401: {"model": ErrorOut, "description": "Reads need a bearer token on this server."},
    },
    summary="Prometheus metrics: requests, jobs by status, profiles stored",
)
def metrics(request: Request, session: SessionDep) -> Response:
    body = request.app.state.metrics.render(session)
    return Response(body, media_type=PROMETHEUS_CONTENT_TYPE)
