"""What `stageprof plan` shows: the plan beside its baselines, its search, a report (the
live progress is in progress_output)."""

import io
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from cli.commands.plan_counts import count_table
from cli.commands.search_output import (
    estimated_ms,
    estimated_note,
    search_lines,
    shows_estimates,
)
from cli.commands.trainer_output import print_trainer
from schemas import ModelSpec, Plan
from schemas import Progress as JobProgress
from schemas.plan import percent, stage_layout
from schemas.profile import MAX_SUCC_STAGES
from schemas.sharding import axes_label

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

MIB = 2**20
STABILITY_STYLES = {"stable": "green", "within_noise": "yellow", "unique": "cyan"}


def stats_of(progress: JobProgress, wall_seconds: float) -> dict[str, Any]:
    """The `stats` of `--json` from a job's progress (the same counts everywhere)."""
    return progress.model_dump() | {"wall_seconds": round(wall_seconds, 3)}


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
                "strategy": st.config.strategy
                + ("" if st.config.mesh_axes is None else f" {axes_label(st.config.mesh_axes)}"),
                "remat": st.remat,
                "cost ms": _ms(st.compute_cost),
                "est ms": estimated_ms(st),
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
    columns first, then letting the layers column wrap), else as one block of lines per
    stage; numbers are never cut."""
    rows = _stage_rows(plan)
    optional = _optional_columns(plan)
    core = ["cost ms", *(["est ms"] if shows_estimates(plan) else []), "peak MiB", "stash MiB"]
    if any(s.schedule_memory is not None for s in plan.stages):
        core.append("mem MiB")
    text = _text_columns(plan)
    for wrap_layers in (False, True):
        for dropped in range(len(optional) + 1):
            numbers = core + optional[: len(optional) - dropped]
            table = Table(title=title, title_justify="left", expand=False)
            for col in text:
                table.add_column(col, no_wrap=col != "layers", overflow="fold")
            for col in numbers:
                table.add_column(col, justify="right", no_wrap=True)
            for row in rows:
                table.add_row(*(row[c] for c in [*text, *numbers]))
            if _natural_width(table) - (_layers_slack(rows) if wrap_layers else 0) <= width:
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
        split += f"; estimated {row['est ms']}" if row["est ms"] != "-" else ""
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


def _layers_slack(rows: list[dict[str, str]]) -> int:
    """How much narrower the layers column gets when its text wraps at spaces: "0-2" above
    "(embed..block1)" (the only column that may wrap)."""
    texts = [row["layers"] for row in rows] + ["layers"]
    words = [word for text in texts for word in text.split()]
    return max(map(len, texts)) - max(map(len, words))


def print_plan(console: Console, spec: ModelSpec, plan: Plan, stats: dict[str, Any]) -> None:
    """The stages table, the predicted time beside the runner-up and each baseline, whether
    the plan is stable against the measured spread, and what it cost."""
    console.print(stage_table(plan, f"pipeline plan for {spec.name}", console.width))
    if plan.outside:
        console.print(outside_line(plan), highlight=False)
    if plan.microbatch_options:
        console.print(count_table(plan))

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
        gap = "" if runner.gap is None else f"+{percent(runner.gap)}"
        note = "; ".join(x for x in (gap, estimated_note(runner.stages)) if x)
        name = f"runner-up ({plan.runner_up_label()})"
        compare.add_row(name, _ms(runner.predicted_iteration_time_s), f"{ratio:.2f}x", note)
    for base in plan.baselines:
        if base.iteration_time_s is None:
            compare.add_row(base.name, "-", "-", base.reason or "infeasible")
        else:
            ratio = base.iteration_time_s / ours if ours > 0 else float("nan")
            note = estimated_note(base.stages)
            compare.add_row(base.name, _ms(base.iteration_time_s), f"{ratio:.2f}x", note)
    console.print(compare)
    if len(plan.schedules) > 1:
        console.print(schedule_table(plan))
    print_stability(console, plan)
    for line in summary_lines(plan, stats):
        console.print(line, highlight=False)
    print_trainer(console, plan)


def outside_line(plan: Plan) -> str:
    """What runs on every device outside the pipeline, and its time per iteration."""
    parts = [
        f"{st.layer_names[0]} ({st.submesh.hosts}x{st.submesh.devices_per_host} "
        f"{st.config.label()}, {_ms(st.compute_cost)} ms)"
        for st in plan.outside
    ]
    return (
        f"outside the pipeline on every device, once per micro-batch: {', '.join(parts)}; "
        f"{_ms(plan.outside_time_s)} ms per iteration (in the plan's time)"
    )


def summary_lines(plan: Plan, stats: dict[str, Any]) -> list[str]:
    """What the plan cost: the stage counts, the search's (measured, estimated, the
    estimates' error), then the planning and total times (short lines, so that no number is
    cut at the end of a 120-column line)."""
    estimated = int(stats.get("estimated") or 0)
    counts = (
        f"{stats['candidates']} candidates, {stats['distinct_stages']} distinct stages: "
        f"{stats['measured']} measured, {stats['reused']} reused, "
        f"{stats['pruned']} pruned, {stats['failed']} failed"
        + (f", {estimated} estimated" if estimated else "")
    )
    times = (
        f"search {plan.dp_wall_seconds * 1e3:.1f} ms ({schedule_label(plan)}: "
        f"{plan.runner_up_wall_seconds * 1e3:.1f} ms); total {stats['wall_seconds']:.1f} s"
    )
    return [counts, *search_lines(plan), times]


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
        note = estimated_note(plan.runner_up.stages)
        layout += f" ({note})" if note else ""
        console.print(
            f"  runner-up ({plan.runner_up_label()}): {layout}",
            style="dim",
            markup=False,
            highlight=False,
        )


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
