"""API errors and their handlers: 400 malformed JSON, 422 field errors, 404, 405, 409, 503.

Bad input never becomes a 500: validation errors name the field path (`loc`, and `field`
as a dotted path without the leading "body"/"query") and the reason; the request's input
is never echoed back (a model can be 64 MiB).
"""

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException
from starlette.routing import Match

log = logging.getLogger(__name__)

Loc = Sequence[str | int]


class ApiError(Exception):
    """An error with an HTTP status and a one-line detail for the client."""

    status_code = 400

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class NotFound(ApiError):
    status_code = 404


class Conflict(ApiError):
    status_code = 409


def field_error(loc: Loc, msg: str, kind: str = "value_error") -> dict[str, Any]:
    """One entry of a 422 answer, in pydantic's shape."""
    return {"loc": tuple(loc), "msg": msg, "type": kind}


def invalid(errors: list[dict[str, Any]]) -> RequestValidationError:
    """A 422 for rules the schemas cannot check alone (raise it from a route)."""
    return RequestValidationError(errors)


def _dotted(loc: Loc) -> str:
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(str(p) for p in parts) or str(loc[0] if loc else "")


def _validation_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    for e in errors:
        if e.get("type") == "json_invalid":
            reason = (e.get("ctx") or {}).get("error", "invalid JSON")
            pos = e["loc"][-1] if len(e["loc"]) > 1 else "?"
            return JSONResponse(
                {"detail": f"malformed JSON: {reason} at character {pos}"}, status_code=400
            )
    detail = [
        {
            "loc": list(e.get("loc", ())),
            "field": _dotted(e.get("loc", ())),
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "value_error")),
        }
        for e in errors
    ]
    return JSONResponse({"detail": detail}, status_code=422)


def _api_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)


PROBED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> list[str]:
    """Every method the request's path is served with, OPTIONS included: each method is
    tried against all the app's routes (a 405 from the router names only the first route of
    the path it tried, not the others of the same path)."""
    methods = {"OPTIONS"}
    for method in PROBED_METHODS:
        probe = {**request.scope, "method": method}
        if any(route.matches(probe)[0] == Match.FULL for route in request.app.router.routes):
            methods.add(method)
    return sorted(methods)


def _http_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request))
        if request.method == "OPTIONS":
            return Response(status_code=204, headers=headers)
    return JSONResponse(
        {"detail": exc.detail}, status_code=exc.status_code, headers=headers or None
    )


def _database_down_handler(_request: Request, exc: Exception) -> JSONResponse:
    log.error("database unavailable: %s", exc)
    return JSONResponse({"detail": "the database is unavailable"}, status_code=503)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(ApiError, _api_error_handler)
    app.add_exception_handler(HTTPException, _http_error_handler)
    app.add_exception_handler(OperationalError, _database_down_handler)
