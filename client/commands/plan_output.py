"""What `stageprof plan` shows: a live progress bar, the plan beside its baselines, a report."""

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from schemas import ModelSpec, Plan
from schemas.plan import percent, stage_layout

MIB = 2**20
STABILITY_STYLES = {"stable": "green", "within_noise": "yellow", "unique": "cyan"}


@contextmanager
def progress_bar(console: Console) -> Iterator[Callable[[Any, Any], None]]:
    """A rich progress bar over candidates: done (reused, failed) and ETA."""
    progress = Progress(
        TextColumn("[bold]profiling"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(
            "reused {task.fields[reused]}  pruned {task.fields[pruned]}  "
            "failed {task.fields[failed]}"
        ),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
    task = progress.add_task("profiling", total=None, reused=0, pruned=0, failed=0)

    def update(job: Any, _stats: Any) -> None:
        if job is None:
            return
        progress.update(
            task,
            total=job.total,
            completed=job.done,
            reused=job.cached,
            pruned=job.pruned,
            failed=job.failed,
        )

    with progress:
        yield update


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def print_plan(console: Console, spec: ModelSpec, plan: Plan, stats: dict[str, Any]) -> None:
    """The stages table, the predicted time beside the runner-up and each baseline, whether
    the plan is stable against the measured spread, and what it cost."""
    table = Table(title=f"pipeline plan for {spec.name}", title_justify="left")
    for col in ("stage", "layers", "submesh", "logical mesh", "strategy"):
        table.add_column(col)
    for col in ("fwd ms", "bwd ms", "peak MiB", "params MiB", "max succ"):
        table.add_column(col, justify="right")
    for i, st in enumerate(plan.stages):
        names = st.layer_names
        layers = f"{st.start}-{st.end}" + (f" ({names[0]}..{names[-1]})" if names else "")
        table.add_row(
            str(i),
            layers,
            str(st.submesh),
            "x".join(map(str, st.config.logical_mesh)),
            st.config.strategy,
            _ms(st.forward_cost),
            _ms(st.backward_cost),
            f"{st.peak_memory / MIB:.1f}",
            f"{st.initial_var_size / MIB:.1f}",
            str(st.max_n_succ_stages),
        )
    console.print(table)

    compare = Table(title="predicted iteration time", title_justify="left")
    compare.add_column("plan")
    compare.add_column("iteration ms", justify="right")
    compare.add_column("vs stageprof", justify="right")
    compare.add_column("note")
    ours = plan.predicted_iteration_time_s
    compare.add_row("stageprof DP", _ms(ours), "1.00x", f"bubble {plan.bubble_fraction:.0%}")
    runner = plan.runner_up
    if runner is not None:
        ratio = runner.predicted_iteration_time_s / ours if ours > 0 else float("nan")
        gap = "" if runner.gap is None else f"DP objective +{percent(runner.gap)}"
        compare.add_row("runner-up", _ms(runner.predicted_iteration_time_s), f"{ratio:.2f}x", gap)
    for base in plan.baselines:
        if base.iteration_time_s is None:
            compare.add_row(base.name, "-", "-", base.reason or "infeasible")
        else:
            ratio = base.iteration_time_s / ours if ours > 0 else float("nan")
            compare.add_row(base.name, _ms(base.iteration_time_s), f"{ratio:.2f}x", "")
    console.print(compare)
    print_stability(console, plan)
    console.print(
        f"{stats['candidates']} candidates, {stats['distinct_stages']} distinct stages: "
        f"{stats['measured']} measured, {stats['reused']} reused, "
        f"{stats.get('pruned', 0)} pruned, {stats['failed']} failed; "
        f"DP {plan.dp_wall_seconds * 1e3:.1f} ms (runner-up "
        f"{plan.runner_up_wall_seconds * 1e3:.1f} ms); total {stats['wall_seconds']:.1f} s"
    )


def print_stability(console: Console, plan: Plan) -> None:
    """e.g. "plan is stable: runner-up 7.3% slower, measured spread 2.1%" and the runner-up's
    stages; nothing for a plan stored before stageprof assessed it."""
    summary = plan.stability_summary()
    if summary is None or plan.stability is None:
        return
    style = STABILITY_STYLES[plan.stability]
    console.print(f"plan is {summary}", style=style, markup=False, highlight=False)
    if plan.runner_up is not None:
        layout = stage_layout(plan.runner_up.stages)
        console.print(f"  runner-up: {layout}", style="dim", markup=False, highlight=False)


def print_json_line(obj: dict[str, Any]) -> None:
    """One JSON object on one line of stdout: the last thing `--json` prints."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def write_report(path: str, sessions: Any, job_id: str) -> None:
    """A standalone HTML page with the job's plan, heatmap and Gantt chart."""
    from server.report import render_job_report
    from store import session_scope

    with session_scope(sessions) as s:
        html = render_job_report(s, job_id=job_id)
    Path(path).write_text(html, encoding="utf-8")
