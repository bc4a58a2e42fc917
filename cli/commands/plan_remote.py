"""`stageprof plan --server URL`: the same job through a running stageprof server."""

import argparse
import sys
import time

from rich.console import Console

from cli.commands.plan_output import print_json_line, print_plan, print_stability, stats_of
from cli.commands.progress_output import job_snapshot, progress_bar
from cli.commands.search_output import search_lines
from cli.commands.trainer_output import print_trainer, trainer_json
from cli.commands.zoo_args import parse_overrides
from client.sdk import ApiError, StageprofClient
from schemas import ClusterSpec, ModelSpec, PlanOptions, PlanRequest, ZooRef


def run_remote(args: argparse.Namespace, cluster: ClusterSpec, options: PlanOptions) -> int:
    """Submit the job, follow its progress, print the plan (or why there is none)."""
    console = Console(stderr=args.json)
    if not console.is_terminal:
        console.width = max(console.width, 120)
    started = time.monotonic()
    if args.model is not None:
        spec: ModelSpec | None = ModelSpec.model_validate_json(args.model.read_text())
        request = PlanRequest(model=spec, cluster=cluster, options=options)
    else:
        zoo = ZooRef(name=args.zoo, config=parse_overrides(args.overrides))
        request = PlanRequest(zoo=zoo, cluster=cluster, options=options)
    with StageprofClient(args.server, token=args.token) as api:
        try:
            ref = api.submit_plan(request, idempotency_key=args.idempotency_key, new=args.new)
        except ApiError as err:
            print(f"stageprof plan: the server refused the request: {err}", file=sys.stderr)
            return 2
        job_id = ref.job_id
        if ref.deduplicated:
            console.print(
                f"[bold]stageprof[/] following job {job_id} ({ref.status.value}) at "
                f"{args.server}: an identical request's job"
            )
        else:
            console.print(f"[bold]stageprof[/] job {job_id} queued at {args.server}")
        with progress_bar(console) as on_progress:
            while True:
                job = api.get_job(job_id)
                on_progress(job_snapshot(job), None)
                if job.status.finished:
                    break
                time.sleep(1.0)
        stats = stats_of(job.progress, time.monotonic() - started)
        if not job.has_plan:
            console.print(f"[red]job {job_id} {job.status.value}:[/] {job.error}")
            if args.json:
                print_json_line(
                    {"job_id": job_id, "plan": None, "stats": stats, "error": job.error}
                )
            return 1
        plan = api.get_plan(job_id)
        spec = api.get_model(job.model_id) if job.model_id else None
    if spec is not None:
        print_plan(console, spec, plan, stats)
    else:
        print_stability(console, plan)
        for line in search_lines(plan):
            console.print(line, highlight=False)
        print_trainer(console, plan)
    if args.json:
        print_json_line(
            {"job_id": job_id, "plan": plan.model_dump(mode="json"), "stats": stats}
            | trainer_json(plan)
        )
    return 0
