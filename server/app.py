"""The FastAPI app factory: `create_app(settings)`; uvicorn runs it with `factory=True`."""

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles

from server.errors import install_error_handlers
from server.metrics import Metrics
from server.middleware import (
    AccessMiddleware,
    BodyGuardMiddleware,
    MetricsMiddleware,
    SecurityHeadersMiddleware,
)
from server.routes import health, jobs, models, pages, plans, profiles
from server.settings import Settings, get_settings
from store import make_engine, make_sessionmaker

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
API_VERSION = "1"
DESCRIPTION = """\
Pipeline-stage profiling and planning for JAX training, as a service (Alpa's stage
profiling and stage construction). Store a model (`POST /v1/models`), ask for a plan
(`POST /v1/plans`, answered `202` with a job), follow the job (`GET /v1/jobs/{id}`) and read
its plan, cost matrix and profile table; cancel it with `POST /v1/jobs/{id}/cancel`. Writes
need `Authorization: Bearer <token>` when the server has `STAGEPROF_API_TOKEN` set; without it
they are accepted only from loopback.

Per-field rules are in the schemas; rules between fields are in each operation's description
and answered `422` naming the field. A NUL character in any URL is a `400`. `OPTIONS` on a
path answers `204`, and a `405` carries `Allow` listing every method the path serves.
"""


def _operation_id(route: APIRoute) -> str:
    """Stable operation ids: `<tag>-<function name>`."""
    tag = route.tags[0] if route.tags else "default"
    return f"{tag}-{route.name}"


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API and dashboard for `settings` (default: from the environment)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        kwargs = {}
        if not settings.database_url.startswith("sqlite"):
            kwargs = {"pool_size": settings.db_pool_size, "max_overflow": settings.db_pool_size}
        engine = make_engine(settings.database_url, **kwargs)
        app.state.engine = engine
        app.state.sessionmaker = make_sessionmaker(engine)
        try:
            yield
        finally:
            engine.dispose()

    app = FastAPI(
        title="stageprof",
        version=API_VERSION,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # Swagger UI and ReDoc load their assets from a CDN
        redoc_url=None,
        generate_unique_id_function=_operation_id,
    )
    app.state.settings = settings
    app.state.metrics = Metrics()
    install_error_handlers(app)
    for module in (models, plans, jobs, profiles, health, pages):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    # Added last = outermost: metrics see every answer, access is checked before the body.
    app.add_middleware(BodyGuardMiddleware, max_bytes=settings.max_model_bytes)
    app.add_middleware(AccessMiddleware, settings=settings)
    app.add_middleware(SecurityHeadersMiddleware)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app
