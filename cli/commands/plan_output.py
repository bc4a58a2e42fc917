"""What `stageprof plan` shows: a live progress bar, the plan beside its baselines, a report."""

import io
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from rich.console import Console, Group
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from cli.commands.trainer_output import print_trainer
from schemas import Job, JobStatus, ModelSpec, Plan
from schemas import Progress as JobProgress
from schemas.plan import percent, stage_layout
from schemas.profile import MAX_SUCC_STAGES

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

MIB = 2**20
STABILITY_STYLES = {"stable": "green", "within_noise": "yellow", "unique": "cyan"}


class JobCounts(Protocol):
    """What the progress displays read: a `store.JobRow`, or `job_snapshot` of an API job."""

    @property
    def status(self) -> object: ...
    @property
    def candidates(self) -> int: ...
    @property
    def distinct_stages(self) -> int: ...
    @property
    def done(self) -> int: ...
    @property
    def measured(self) -> int: ...
    @property
    def reused(self) -> int: ...
    @property
    def pruned(self) -> int: ...
    @property
    def failed(self) -> int: ...


# Called with the job's counts (None: not known yet) and the runner's stats (unused here).
ProgressUpdate = Callable[[JobCounts | None, object], None]


@dataclass(frozen=True)
class JobSnapshot:
    """An API job as the progress displays read it (`JobCounts`)."""

    status: JobStatus
    candidates: int
    distinct_stages: int
    measured: int
    reused: int
    failed: int
    pruned: int
    done: int
    pending: int
    waiting: str | None = None


@contextmanager
def progress_bar(console: Console) -> Iterator[ProgressUpdate]:
    """Progress of a local job: a rich bar on a terminal, else plain lines (`plain_progress`)."""
    if not console.is_terminal:
        with plain_progress(console.file) as update:
            yield update
        return
    with _rich_progress(console) as update:
        yield update


def job_snapshot(job: Job) -> JobSnapshot:
    """A job from the API as the progress displays read it: its status and its counts."""
    return JobSnapshot(status=job.status, waiting=job.waiting, **job.progress.model_dump())


def stats_of(progress: JobProgress, wall_seconds: float) -> dict[str, Any]:
    """The `stats` of `--json` from a job's progress (the same counts everywhere)."""
    return progress.model_dump() | {"wall_seconds": round(wall_seconds, 3)}


def progress_line(job: JobCounts | None, elapsed_s: float) -> str:
    """One line of progress from a job row or `Job.progress`-like object (None: starting)."""
    if job is None:
        return f"starting: workers and the model's stages ({elapsed_s:.0f}s)"
    phase = _phase(job)
    total, done = job.distinct_stages, job.done
    if phase == "queued":
        return f"queued: waiting for a worker to take the job, {elapsed_s:.0f}s elapsed"
    eta = ""
    if 0 < done < total:
        eta = f", ETA {elapsed_s / done * (total - done):.0f}s"
    waiting = getattr(job, "waiting", None)
    return (
        f"{phase}: {done}/{total} stages done (measured {job.measured}, reused "
        f"{job.reused}, pruned {job.pruned}, failed {job.failed}; {job.candidates} "
        f"candidates), {elapsed_s:.0f}s elapsed{eta}" + (f"; {waiting}" if waiting else "")
    )


def _phase(job: JobCounts) -> str:
    status = getattr(job, "status", None)
    return str(getattr(status, "value", status) or "profiling")


@contextmanager
def plain_progress(stream: IO[str], interval_s: float = 10.0) -> Iterator[ProgressUpdate]:
    """Plain progress lines for logs and CI: one line now, one whenever the phase changes,
    one at least every `interval_s` seconds while nothing else is printed, and one at the end
    when the counts changed since the last line."""
    started = time.monotonic()
    state: dict[str, Any] = {"job": None, "phase": None, "unprinted": False}
    lock = threading.Lock()
    stop = threading.Event()

    def emit() -> None:
        with lock:
            state["unprinted"] = False
            stream.write(progress_line(state["job"], time.monotonic() - started) + "\n")
            stream.flush()

    def update(job: JobCounts | None, _stats: object) -> None:
        phase = (getattr(job, "status", None), getattr(job, "waiting", None))
        with lock:
            changed = phase != state["phase"]
            state["job"], state["phase"], state["unprinted"] = job, phase, True
        if changed:
            emit()

    def tick() -> None:
        while not stop.wait(interval_s):
            emit()

    emit()
    thread = threading.Thread(target=tick, name="stageprof-progress", daemon=True)
    thread.start()
    try:
        yield update
    finally:
        stop.set()
        thread.join()
        if state["unprinted"]:
            emit()


@contextmanager
def _rich_progress(console: Console) -> Iterator[ProgressUpdate]:
    """A rich progress bar over candidates: done (reused, failed) and ETA."""
    progress = Progress(
        TextColumn("[bold]{task.fields[phase]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("stages"),
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
    task = progress.add_task(
        "profiling", total=None, phase="starting", reused=0, pruned=0, failed=0
    )

    def update(job: JobCounts | None, _stats: object) -> None:
        if job is None:
            return
        waiting = getattr(job, "waiting", None)
        progress.update(
            task,
            phase=f"{_phase(job)} ({waiting})" if waiting else _phase(job),
            total=job.distinct_stages,
            completed=job.done,
            reused=job.reused,
            pruned=job.pruned,
            failed=job.failed,
        )

    with progress:
        yield update


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def succ_text(n: int) -> str:
    """`max_n_succ_stages` for people: `-1` is infeasible, the clamp 2**20 means no limit."""
    if n >= MAX_SUCC_STAGES:
        return "no limit"
    return "infeasible" if n < 0 else str(n)


def _stage_rows(plan: Plan) -> list[dict[str, str]]:
    rows = []
    for i, st in enumerate(plan.stages):
        names = st.layer_names
        memory = st.schedule_memory
        rows.append(
            {
                "stage": str(i),
                "group": str(i if st.device_group is None else st.device_group),
                "layers": f"{st.start}-{st.end}" + (f" ({names[0]}..{names[-1]})" if names else ""),
                "submesh": f"{st.submesh.hosts}x{st.submesh.devices_per_host}",
                "logical mesh": "x".join(map(str, st.config.logical_mesh)),
                "strategy": st.config.strategy,
                "remat": st.remat,
                "cost ms": _ms(st.compute_cost),
                "fwd ms": _ms(st.forward_cost),
                "bwd ms": _ms(st.backward_cost),
                "peak MiB": f"{st.peak_memory / MIB:.1f}",
                "stash MiB": f"{st.intermediate_size / MIB:.2f}",
                "params MiB": f"{st.initial_var_size / MIB:.1f}",
                "max succ": succ_text(st.max_n_succ_stages),
                "B ms": "-" if st.input_grad_cost is None else _ms(st.input_grad_cost),
                "W ms": "-" if st.weight_cost is None else _ms(st.weight_cost),
                "mem MiB": "-" if memory is None else f"{memory / MIB:.1f}",
            }
        )
    return rows


def _text_columns(plan: Plan) -> tuple[str, ...]:
    """The stage table's text columns; "group" when chunks share device groups, "remat" when
    some stage is rematerialized."""
    base: tuple[str, ...] = ("stage", "layers", "submesh", "logical mesh", "strategy")
    if any(st.remat != "as_written" for st in plan.stages):
        base = (*base, "remat")
    return (*base[:1], "group", *base[1:]) if plan.virtual_stages > 1 else base


def _optional_columns(plan: Plan) -> list[str]:
    """Columns dropped first when the table is too wide; B and W when the backward is split."""
    split = plan.schedule_name == "zb-h1"
    return ["fwd ms", "bwd ms", *(["B ms", "W ms"] if split else []), "params MiB", "max succ"]


def stage_table(plan: Plan, title: str, width: int) -> Table | Group:
    """The plan's stages as a table when it fits `width` columns (dropping the optional
    columns first), else as one block of lines per stage; numbers are never cut."""
    rows = _stage_rows(plan)
    optional = _optional_columns(plan)
    core = ["cost ms", "peak MiB", "stash MiB"]
    if any(s.schedule_memory is not None for s in plan.stages):
        core.append("mem MiB")
    text = _text_columns(plan)
    for dropped in range(len(optional) + 1):
        numbers = core + optional[: len(optional) - dropped]
        table = Table(title=title, title_justify="left", expand=False)
        for col in text:
            table.add_column(col, no_wrap=col != "layers", overflow="fold")
        for col in numbers:
            table.add_column(col, justify="right", no_wrap=True)
        for row in rows:
            table.add_row(*(row[c] for c in [*text, *numbers]))
        if _natural_width(table) <= width:
            return table
    lines: list[Text] = [Text(title, style="italic")]
    for row in rows:
        lines.append(
            Text(
                f"stage {row['stage']}: layers {row['layers']}, submesh {row['submesh']}, "
                f"mesh {row['logical mesh']} {row['strategy']}, device group {row['group']}",
                style="bold",
            )
        )
        split = f", B {row['B ms']}, W {row['W ms']}" if row["W ms"] != "-" else ""
        lines.append(
            Text(
                f"  cost {row['cost ms']} ms (fwd {row['fwd ms']}, bwd {row['bwd ms']}{split}); "
                f"peak {row['peak MiB']} MiB; stash {row['stash MiB']} MiB; "
                f"params {row['params MiB']} MiB; max succ {row['max succ']}; "
                f"under the schedule {row['mem MiB']} MiB"
            )
        )
    return Group(*lines)


def _natural_width(table: Table) -> int:
    wide = Console(width=10_000, file=io.StringIO())
    return wide.measure(table).maximum


def print_plan(console: Console, spec: ModelSpec, plan: Plan, stats: dict[str, Any]) -> None:
    """The stages table, the predicted time beside the runner-up and each baseline, whether
    the plan is stable against the measured spread, and what it cost."""
    console.print(stage_table(plan, f"pipeline plan for {spec.name}", console.width))

    compare = Table(title="predicted iteration time", title_justify="left")
    compare.add_column("plan", overflow="fold")
    compare.add_column("iteration ms", justify="right", no_wrap=True)
    compare.add_column("vs stageprof", justify="right", no_wrap=True)
    compare.add_column("note", overflow="fold")
    ours = plan.predicted_iteration_time_s
    compare.add_row(
        f"stageprof ({schedule_label(plan)})",
        _ms(ours),
        "1.00x",
        f"bubble {plan.bubble_fraction:.0%}",
    )
    runner = plan.runner_up
    if runner is not None:
        ratio = runner.predicted_iteration_time_s / ours if ours > 0 else float("nan")
        gap = "" if runner.gap is None else f"+{percent(runner.gap)}, same schedule"
        compare.add_row("runner-up", _ms(runner.predicted_iteration_time_s), f"{ratio:.2f}x", gap)
    for base in plan.baselines:
        if base.iteration_time_s is None:
            compare.add_row(base.name, "-", "-", base.reason or "infeasible")
        else:
            ratio = base.iteration_time_s / ours if ours > 0 else float("nan")
            compare.add_row(base.name, _ms(base.iteration_time_s), f"{ratio:.2f}x", "")
    console.print(compare)
    if len(plan.schedules) > 1:
        console.print(schedule_table(plan))
    print_stability(console, plan)
    for line in summary_lines(plan, stats):
        console.print(line, highlight=False)
    print_trainer(console, plan)


def summary_lines(plan: Plan, stats: dict[str, Any]) -> tuple[str, str]:
    """What the plan cost: the stage counts, then the planning and total times (two short
    lines, so that no number is cut at the end of a 120-column line)."""
    counts = (
        f"{stats['candidates']} candidates, {stats['distinct_stages']} distinct stages: "
        f"{stats['measured']} measured, {stats['reused']} reused, "
        f"{stats['pruned']} pruned, {stats['failed']} failed"
    )
    times = (
        f"search {plan.dp_wall_seconds * 1e3:.1f} ms ({schedule_label(plan)}: "
        f"{plan.runner_up_wall_seconds * 1e3:.1f} ms); total {stats['wall_seconds']:.1f} s"
    )
    return counts, times


def schedule_label(plan: Plan) -> str:
    """e.g. "1f1b", "interleaved, v=2"."""
    name = plan.schedule_name
    return f"{name}, v={plan.virtual_stages}" if name == "interleaved" else name


def schedule_table(plan: Plan) -> Table:
    """Each schedule's best plan side by side: time, bubble, peak memory, or why none."""
    table = Table(title="schedules (auto picks the fastest)", title_justify="left")
    for col in ("schedule", "v", "iteration ms", "vs chosen", "bubble", "peak MiB"):
        table.add_column(col, justify="left" if col == "schedule" else "right", no_wrap=True)
    table.add_column("stages / why not", overflow="fold")
    ours = plan.predicted_iteration_time_s
    for o in plan.schedules:
        name = f"{o.schedule} (chosen)" if o.chosen else o.schedule
        if not o.feasible or o.predicted_iteration_time_s is None:
            table.add_row(name, "-", "-", "-", "-", "-", o.reason or "infeasible")
            continue
        t = o.predicted_iteration_time_s
        table.add_row(
            name,
            str(o.virtual_stages),
            _ms(t),
            f"{t / ours:.2f}x" if ours > 0 else "-",
            f"{o.bubble_fraction or 0:.0%}",
            "-" if o.peak_memory is None else f"{o.peak_memory / MIB:.1f}",
            o.layout,
        )
    return table


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


def write_report(path: str, sessions: "sessionmaker[Session]", job_id: str) -> None:
    """A standalone HTML page with the job's plan, heatmap and Gantt chart."""
    from server.report import render_job_report
    from store import session_scope

    with session_scope(sessions) as s:
        html = render_job_report(s, job_id=job_id)
    Path(path).write_text(html, encoding="utf-8")
