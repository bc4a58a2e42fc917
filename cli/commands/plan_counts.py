"""`stageprof plan --micro-batches auto` (or a list of counts), embedded: the count of
micro-batches searched at a fixed global batch.

The model is traced once with a symbolic batch dimension (`client.symbolic_batch`); each
count B is an ordinary job on the spec stated at micro-batch global batch / B
(`programs.spec_at_batch`), so its stages are measured at that size and keyed by it; the
fastest plan in simulated time answers (`planner.microbatches.choose_count`), every count's
best shown beside it.
"""

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from cli.commands.zoo_args import one_line, parse_overrides
from schemas import ClusterSpec, ModelSpec, Plan, PlanOptions

# cli.commands.plan.queue_embedded_job: (store url, spec, cluster, options) -> (sessions, id)
QueueJob = Callable[[str | None, ModelSpec, ClusterSpec, PlanOptions], tuple[Any, str]]


def parse_micro_batches(text: str) -> dict[str, Any]:
    """`--micro-batches`: a count ("8"), "auto", or counts to search ("4,8,16,32"), as
    PlanOptions fields."""
    text = text.strip()
    if text == "auto":
        return {"microbatch_search": "auto"}
    if "," in text:
        try:
            counts = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"counts must be integers, got {text!r}") from None
        return {"microbatch_search": counts}
    try:
        return {"num_microbatches": int(text)}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a count, 'auto' or a list like 4,8,16, got {text!r}"
        ) from None


def load_symbolic_model(args: argparse.Namespace) -> ModelSpec:
    """The model with a symbolic batch dimension: a zoo model traced so, or a spec file
    (which must carry one unless only its own size is planned)."""
    if args.model is not None:
        import programs

        return programs.verified(ModelSpec.model_validate_json(args.model.read_text()))
    from client.symbolic_batch import build_zoo_symbolic

    return build_zoo_symbolic(args.zoo, **parse_overrides(args.overrides))


def run_counts_local(
    args: argparse.Namespace, cluster: ClusterSpec, options: PlanOptions, queue_job: QueueJob
) -> int:
    """Plan each count as its own embedded job (`queue_job` queues one) and print the
    fastest plan beside the others."""
    from cli.commands.plan_output import print_json_line, print_plan
    from cli.commands.progress_output import progress_bar
    from cli.commands.worker import runner_config
    from planner.microbatches import choose_count
    from programs import spec_at_batch
    from workers.cluster.ray_env import connect_ray
    from workers.jobs.runner import JobRunner

    console = Console(stderr=args.json)
    if not console.is_terminal:
        console.width = max(console.width, 120)
    started = time.monotonic()
    connect_ray(verbose=args.verbose)  # before jax is imported: Ray forks its processes
    try:
        spec = load_symbolic_model(args)
        traced = spec.micro_batch_size
        counts = options.microbatch_counts(traced)
        batch = options.global_batch(traced)
        specs = {b: spec_at_batch(spec, batch // b) for b in counts}
    except (ValueError, OSError) as err:
        print(f"stageprof plan: {one_line(err)}", file=sys.stderr)
        return 2
    console.print(
        f"[bold]stageprof[/] planning [cyan]{spec.name}[/] at global batch {batch}, "
        f"micro-batches {counts}, on {cluster.num_hosts}x{cluster.devices_per_host}",
        highlight=False,
    )
    plans: dict[int, Plan | str] = {}
    seconds: dict[int, float] = {}
    totals: dict[str, Any] = {}
    config = runner_config(args)
    for b in counts:
        began = time.monotonic()
        sessions, job_id = queue_job(
            args.database_url, specs[b], cluster, options.at_count(b, traced)
        )
        with progress_bar(console) as on_progress:
            outcome = JobRunner(sessions, config, on_progress=on_progress).run_next(job_id)
        assert outcome is not None, "the job just created could not be claimed"
        plans[b] = outcome.plan if outcome.plan is not None else str(outcome.error)
        seconds[b] = time.monotonic() - began
        for name, value in outcome.stats.as_dict().items():  # every count's jobs together
            if isinstance(value, int | float) and not isinstance(value, bool):
                totals[name] = totals.get(name, 0) + value
        console.print(f"{b} micro-batches of {batch // b}: job {job_id}, {seconds[b]:.1f} s")
    try:
        plan = choose_count(plans, batch)
    except ValueError as err:
        console.print(f"[red]no plan:[/] {err}")
        return 1
    stats = totals | {
        "wall_seconds": round(time.monotonic() - started, 3),
        "count_seconds": {b: round(t, 3) for b, t in seconds.items()},
    }
    print_plan(console, specs[plan.num_microbatches], plan, stats)
    console.print(count_table(plan, seconds))
    if args.json:
        print_json_line({"plan": plan.model_dump(mode="json"), "stats": stats})
    return 0


def count_table(plan: Plan, seconds: dict[int, float]) -> Table:
    """Each count's best plan beside the chosen one."""
    table = Table(title="micro-batches searched", title_justify="left")
    for name in ("count", "micro-batch", "iteration ms", "schedule", "stages", "plan s"):
        table.add_column(name, overflow="fold")
    for o in plan.microbatch_options:
        mark = " *" if o.chosen else ""
        t = o.predicted_iteration_time_s
        table.add_row(
            f"{o.num_microbatches}{mark}",
            str(o.micro_batch_size),
            f"{t * 1e3:.3f}" if t is not None else (o.reason or "-"),
            o.schedule or "-",
            o.layout or "-",
            f"{seconds.get(o.num_microbatches, 0.0):.1f}",
        )
    return table
