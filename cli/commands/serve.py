"""`stageprof serve`: run the REST API and dashboard with uvicorn."""

import argparse
import os
import tempfile
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("serve", help="run the REST API and the dashboard")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument(
        "--workers", type=int, default=1, help="uvicorn worker processes (default 1)"
    )
    parser.add_argument(
        "--database-url", help="database URL (default: STAGEPROF_DATABASE_URL or ./stageprof.db)"
    )
    parser.add_argument(
        "--no-migrate",
        action="store_true",
        help="do not bring the database to the latest schema before starting",
    )
    parser.add_argument("--log-level", default="info", help="uvicorn log level (default info)")
    parser.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from store import DATABASE_URL_ENV, database_url

    if args.workers < 1:
        raise SystemExit("--workers must be >= 1")
    if args.database_url:
        # Worker processes build their own app from the environment.
        os.environ[DATABASE_URL_ENV] = args.database_url
    if not args.no_migrate:
        from migrations import upgrade

        upgrade(database_url())
    if args.workers > 1:
        _multiprocess_metrics_dir()
    uvicorn.run(
        "server.app:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
    )
    return 0


def _multiprocess_metrics_dir() -> None:
    """Worker processes count requests in Prometheus multiprocess files so that `/metrics`
    of any one shows them all: `PROMETHEUS_MULTIPROC_DIR` (emptied of the files of an
    earlier run), or a fresh temporary directory when unset."""
    from server.metrics import MULTIPROC_DIR_ENV

    given = os.environ.get(MULTIPROC_DIR_ENV, "").strip()
    if not given:
        os.environ[MULTIPROC_DIR_ENV] = tempfile.mkdtemp(prefix="stageprof-metrics-")
        return
    path = Path(given)
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.db"):
        old.unlink()
