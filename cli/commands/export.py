"""`stageprof export JOB --format {json,alpa,maxtext,jaxpp}`: a stored plan in a trainer's
form, from the embedded store or a server (the same text as `GET /v1/jobs/{id}/plan?format=`)."""

import argparse
import sys
from typing import TYPE_CHECKING

from schemas.trainer_export import EXPORT_FORMATS

if TYPE_CHECKING:
    from schemas import Plan


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("export", help="a stored plan as JSON, Alpa, MaxText or JaxPP form")
    parser.add_argument("job", help="the job id")
    parser.add_argument("--format", choices=EXPORT_FORMATS, default="json", help="(default json)")
    parser.add_argument("--server", help="read the plan from a stageprof server at this URL")
    parser.add_argument("--token", help="API token for --server (or STAGEPROF_API_TOKEN)")
    parser.add_argument("--database-url", help="store URL (default STAGEPROF_DATABASE_URL)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from schemas.trainer_export import ExportUnavailable, export_plan

    plan = _remote_plan(args) if args.server else _local_plan(args)
    if isinstance(plan, str):
        print(f"stageprof export: {plan}", file=sys.stderr)
        return 1
    try:
        sys.stdout.write(export_plan(plan, args.format))
    except ExportUnavailable as err:
        print(f"stageprof export: job {args.job}: {err}", file=sys.stderr)
        return 1
    return 0


def _local_plan(args: argparse.Namespace) -> "Plan | str":
    from store import (
        database_url,
        get_job,
        job_plan,
        make_engine,
        make_sessionmaker,
        session_scope,
    )

    sessions = make_sessionmaker(make_engine(args.database_url or database_url()))
    with session_scope(sessions, write=False) as s:
        row = get_job(s, job_id=args.job)
        if row is None:
            return f"no job {args.job!r}"
        plan = job_plan(row)
        if plan is None:
            return f"job {args.job} has no plan (status {row.status})"
        return plan


def _remote_plan(args: argparse.Namespace) -> "Plan | str":
    from client.sdk import ApiError, StageprofClient

    with StageprofClient(args.server, token=args.token) as api:
        try:
            return api.get_plan(args.job)
        except ApiError as err:
            return str(err)
