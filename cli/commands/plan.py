"""`stageprof plan`: profile every stage candidate of a model and print the pipeline plan.

Embedded by default (a SQLite file, a local Ray, JAX on virtual CPU devices); with
`--server URL` the same job runs on a stageprof server and its workers.
"""

import argparse
import json
import sys
import time
import typing
from typing import TYPE_CHECKING, Any

from cli.commands.measure_args import (
    add_device_memory_argument,
    add_measurement_arguments,
    add_search_arguments,
    field_argument,
    field_default,
    measurement_options,
)
from cli.commands.plan_counts import load_symbolic_model, parse_micro_batches
from cli.commands.worker import add_runner_arguments, runner_config
from cli.commands.zoo_args import (
    add_model_arguments,
    load_model,
    one_line,
    parse_overrides,
)
from schemas import ClusterSpec, ModelSpec, PlanOptions
from schemas.plan import SubmeshSpace

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

GIB = 2**30


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("plan", help="profile a model's stage candidates and plan it")
    add_model_arguments(parser, default_zoo="gpt")
    field_argument(parser, "--hosts", ClusterSpec, "num_hosts")
    field_argument(parser, "--devices-per-host", ClusterSpec, "devices_per_host")
    field_argument(parser, "--device-kind", ClusterSpec, "device_kind")
    add_device_memory_argument(parser)
    field_argument(
        parser,
        "--micro-batches",
        PlanOptions,
        "num_microbatches",
        type=parse_micro_batches,
        metavar="B|auto|B1,B2,..",
        help="micro-batches per iteration (default: 4); 'auto' or a list (4,8,16,32) "
        "searches the count at the global batch (--global-batch, default: the model's "
        "micro-batch size x 4) in one job, the fastest plan answering",
    )
    field_argument(parser, "--global-batch", PlanOptions, "global_batch_size", type=int)
    spaces = [s for s in typing.get_args(SubmeshSpace) if s != "manual"]  # no flag for manual
    field_argument(parser, "--submesh-space", PlanOptions, "submesh_space", choices=spaces)
    field_argument(parser, "--config-space", PlanOptions, "config_space")
    strategies = ",".join(field_default(PlanOptions, "strategies"))
    field_argument(
        parser, "--strategies", PlanOptions, "strategies", default=strategies, metavar="A,B"
    )
    parser.add_argument(
        "--mesh-axes",
        metavar="A,B",
        help="also search sharding configs as mesh axes: every split of a submesh's devices "
        "over these of data,fsdp,tensor,context,expert (e.g. data,fsdp,tensor,expert for an "
        "MoE; add context for long sequences), under --mesh-rules",
    )
    parser.add_argument(
        "--mesh-rules",
        default="maxtext",
        metavar="PRESET|JSON",
        help="logical-axis rules of the --mesh-axes configs: a preset (maxtext: MaxText's "
        "defaults; pure-fsdp) or a JSON table such as "
        '\'{"batch": ["data", "fsdp"], "embed": ["fsdp"], "mlp": ["tensor"]}\' '
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--sharding",
        action="append",
        default=[],
        metavar="JSON",
        help="a sharding config of your own, tried on every submesh it fits (repeatable): "
        '\'{"name": "mine", "mesh_axes": {"fsdp": -1, "tensor": 2}, "rules": {...}}\' '
        "(rules default to MaxText's)",
    )
    field_argument(
        parser,
        "--tensor-across-hosts",
        PlanOptions,
        "tensor_across_hosts",
        action="store_true",
    )
    add_measurement_arguments(parser)
    add_search_arguments(parser)
    field_argument(parser, "--timeout", PlanOptions, "candidate_timeout_s")
    field_argument(
        parser, "--communication", PlanOptions, "include_communication", action="store_true"
    )
    field_argument(parser, "--schedule", PlanOptions, "schedule")
    field_argument(parser, "--virtual-stages", PlanOptions, "virtual_stages", type=int, metavar="V")
    field_argument(parser, "--remat", PlanOptions, "remat")
    field_argument(
        parser, "--for", PlanOptions, "target", dest="target", choices=["maxtext", "jaxpp"]
    )
    field_argument(
        parser,
        "--no-outside-layers",
        PlanOptions,
        "outside_layers",
        dest="outside_layers",
        action="store_false",
        help="keep every layer in the pipeline (Alpa's space): never run the layers around "
        "the repeated blocks on every device outside it (outside_layers: false)",
    )
    parser.add_argument("--server", help="run the job on a stageprof server at this URL")
    parser.add_argument("--token", help="API token for --server (or STAGEPROF_API_TOKEN)")
    parser.add_argument(
        "--idempotency-key",
        help="with --server: a retry with the same key gets the same job (e.g. a CI run id)",
    )
    parser.add_argument(
        "--new",
        action="store_true",
        help="with --server: a new job even if an identical one is queued or running",
    )
    parser.add_argument("--database-url", help="store URL (default STAGEPROF_DATABASE_URL)")
    parser.add_argument("--report", help="write an HTML report (heatmap, Gantt) to this file")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    add_runner_arguments(parser)
    parser.set_defaults(func=run)


def _request_parts(args: argparse.Namespace) -> tuple[ClusterSpec, PlanOptions]:
    cluster = ClusterSpec(
        num_hosts=args.hosts,
        devices_per_host=args.devices_per_host,
        device_kind=args.device_kind,
        device_memory_bytes=int(args.device_memory_gib * GIB),
    )
    micro = args.micro_batches
    counts = micro if isinstance(micro, dict) else {"num_microbatches": micro}
    options = PlanOptions(
        **counts,
        global_batch_size=args.global_batch,
        submesh_space=args.submesh_space,
        config_space=args.config_space,
        strategies=[
            s.strip() for s in args.strategies.split(",") if s.strip() and s.strip() != "none"
        ],
        **sharding_options(args),
        **measurement_options(args),
        candidate_timeout_s=args.timeout,
        include_communication=args.communication,
        schedule=args.schedule,
        virtual_stages=args.virtual_stages,
        remat=args.remat,
        target=args.target,
        outside_layers=args.outside_layers,
        search=args.search,
    )
    return cluster, options


def sharding_options(args: argparse.Namespace) -> dict[str, Any]:
    """The mesh-axes options of `--mesh-axes`, `--mesh-rules`, `--sharding`,
    `--tensor-across-hosts` (ValueError for JSON that does not parse)."""
    out: dict[str, Any] = {"tensor_across_hosts": args.tensor_across_hosts}
    if args.mesh_axes:
        out["mesh_axes"] = [a.strip() for a in args.mesh_axes.split(",") if a.strip()]
    rules = args.mesh_rules.strip()
    out["mesh_rules"] = _json(rules, "--mesh-rules") if rules.startswith("{") else rules
    if args.sharding:
        out["shardings"] = [_json(text, "--sharding") for text in args.sharding]
    return out


def _json(text: str, flag: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{flag}: not JSON ({err})") from err


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    try:
        cluster, options = _request_parts(args)
        if args.model is None:
            parse_overrides(args.overrides)
    except (ValidationError, ValueError) as err:
        print(f"stageprof plan: {one_line(err)}", file=sys.stderr)
        return 2
    if args.server:
        from cli.commands.plan_remote import run_remote

        return run_remote(args, cluster, options)
    return _run_local(args, cluster, options)


def queue_embedded_job(
    url: str | None, spec: ModelSpec, cluster: ClusterSpec, options: PlanOptions
) -> tuple["sessionmaker[Session]", str]:
    """The store at `url` (default STAGEPROF_DATABASE_URL or ./stageprof.db; SQLite is
    migrated here) and a job for `spec` queued in it: (its sessionmaker, the job id)."""
    from migrations import upgrade
    from store import (
        create_job,
        database_url,
        make_engine,
        make_sessionmaker,
        put_model,
        session_scope,
    )

    url = url or database_url()
    if url.startswith("sqlite"):
        upgrade(url)
    sessions = make_sessionmaker(make_engine(url))
    with session_scope(sessions) as s:
        model, _ = put_model(s, spec=spec)
        job_id = create_job(s, model_id=model.id, cluster=cluster, options=options).id
    return sessions, job_id


def _run_local(args: argparse.Namespace, cluster: ClusterSpec, options: PlanOptions) -> int:
    from rich.console import Console

    from cli.commands.plan_output import print_json_line, print_plan, write_report
    from cli.commands.progress_output import progress_bar
    from cli.commands.trainer_output import trainer_json
    from store import get_job, session_scope
    from workers.cluster.ray_env import connect_ray
    from workers.jobs.runner import JobRunner

    console = Console(stderr=args.json)
    if not console.is_terminal:
        console.width = max(console.width, 120)
    started = time.monotonic()
    console.print("connecting to Ray and loading the model", highlight=False)
    connect_ray(verbose=args.verbose)  # before jax is imported: Ray forks its processes
    try:
        searched = options.microbatch_search is not None  # traced with a symbolic batch
        spec = load_symbolic_model(args) if searched else load_model(args)
        options.check_micro_batch(spec.micro_batch_size)
    except (ValueError, OSError) as err:
        print(f"stageprof plan: {one_line(err)}", file=sys.stderr)
        return 2
    sessions, job_id = queue_embedded_job(args.database_url, spec, cluster, options)
    console.print(
        f"[bold]stageprof[/] planning [cyan]{spec.name}[/] ({spec.num_layers} layers) on "
        f"{cluster.num_hosts}x{cluster.devices_per_host} {cluster.device_kind}; job {job_id}"
    )
    with progress_bar(console) as on_progress:
        runner = JobRunner(sessions, runner_config(args), on_progress=on_progress)
        outcome = runner.run_next(job_id)
        with session_scope(sessions) as s:
            on_progress(get_job(s, job_id=job_id), None)  # the final counts, as stored
    assert outcome is not None, "the job just created could not be claimed"
    stats = outcome.stats.as_dict()
    stats["wall_seconds"] = round(time.monotonic() - started, 3)
    if outcome.plan is None:
        console.print(f"[red]job {job_id} {outcome.status.value}:[/] {outcome.error}")
        if args.json:
            print_json_line(
                {"job_id": job_id, "plan": None, "stats": stats, "error": outcome.error}
            )
        return 1
    print_plan(console, spec, outcome.plan, stats)
    if args.report:
        write_report(args.report, sessions, job_id)
        console.print(f"report written to [bold]{args.report}[/]")
    if args.json:
        plan = outcome.plan
        print_json_line(
            {"job_id": job_id, "plan": plan.model_dump(mode="json"), "stats": stats}
            | trainer_json(plan)
        )
    return 0
