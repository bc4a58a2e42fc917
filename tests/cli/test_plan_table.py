"""The plan as `stageprof plan` prints it fits the terminal and never cuts a number."""

import io
import re

import pytest
from rich.console import Console

from cli.commands.plan_output import print_plan, succ_text
from schemas.profile import MAX_SUCC_STAGES
from tests.server.factories import exported_chain_spec, make_plan

STATS = {
    "candidates": 10,
    "distinct_stages": 8,
    "measured": 5,
    "reused": 2,
    "pruned": 1,
    "failed": 0,
    "wall_seconds": 12.5,
}


@pytest.mark.parametrize("width", [60, 80, 200])
def test_plan_output_fits_the_width_and_keeps_every_number(width: int) -> None:
    plan = make_plan(num_layers=6, num_microbatches=4, salt="table")
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None)
    print_plan(console, exported_chain_spec(6), plan, STATS)
    text = out.getvalue()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    assert "…" not in text
    for st in plan.stages:
        cost = f"{st.compute_cost * 1e3:.2f}"
        peak = f"{st.peak_memory / 2**20:.1f}"
        stash = f"{st.intermediate_size / 2**20:.2f}"
        for number in (cost, peak, stash):
            assert re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", text), (number, text)
    if width >= 200:
        header = next(line for line in lines if "logical mesh" in line)
        for col in ("stage", "layers", "submesh", "strategy", "cost ms", "peak MiB", "stash"):
            assert col in header


def test_no_limit_is_said_in_words() -> None:
    assert succ_text(MAX_SUCC_STAGES) == "no limit"
    assert succ_text(-1) == "infeasible" and succ_text(3) == "3"


def test_the_summary_keeps_each_figure_on_one_line_at_120_columns() -> None:
    plan = make_plan(num_layers=6, num_microbatches=4, salt="summary")
    plan = plan.model_copy(update={"dp_wall_seconds": 12.3456, "runner_up_wall_seconds": 9.87})
    stats = {
        "candidates": 123456,
        "distinct_stages": 12345,
        "measured": 10000,
        "reused": 2000,
        "pruned": 300,
        "failed": 45,
        "wall_seconds": 67.3,
    }
    out = io.StringIO()
    print_plan(Console(file=out, width=120, color_system=None), exported_chain_spec(6), plan, stats)
    lines = out.getvalue().splitlines()
    counts = "123456 candidates, 12345 distinct stages: 10000 measured, 2000 reused, 300 pruned"
    assert any(counts in line and "45 failed" in line for line in lines), lines[-3:]
    label = plan.schedule_name
    assert any(f"search 12345.6 ms ({label}: 9870.0 ms); total 67.3 s" in line for line in lines)


@pytest.mark.parametrize("schedule", ["auto", "zb-h1", "interleaved"])
def test_plan_output_names_the_schedule_and_shows_the_others(schedule: str) -> None:
    from tests.planner.helpers import programless_chain_spec as planner_spec
    from tests.planner.test_schedule_search import _plan

    plan = _plan(3, schedule=schedule)
    out = io.StringIO()
    print_plan(Console(file=out, width=200, color_system=None), planner_spec(4), plan, STATS)
    text = out.getvalue()
    assert f"stageprof ({plan.schedule_name}" in text
    if schedule == "auto":
        assert "schedules (auto picks the fastest)" in text
        for name in ("1f1b", "gpipe", "zb-h1", "interleaved"):
            assert name in text
        assert f"{plan.schedule_name} (chosen)" in text
    else:
        assert "schedules (auto" not in text
    if schedule == "zb-h1":
        assert "B ms" in text and "W ms" in text
    if schedule == "interleaved":
        assert re.search(r"\bgroup\b", text)
