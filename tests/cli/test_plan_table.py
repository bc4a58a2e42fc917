"""The plan as `stageprof plan` prints it fits the terminal and never cuts a number; an
estimate search's figures (measured, estimated, the estimates' error) are shown."""

import io
import json
import re

import pytest
from rich.console import Console

from cli.commands.plan_output import print_json_line, print_plan, succ_text
from cli.commands.search_output import search_lines
from schemas import Plan, SearchSummary
from schemas.profile import MAX_SUCC_STAGES
from tests.server.factories import exported_chain_spec, make_plan
from tests.support.estimates import SEARCH, with_search

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

    plan = _plan(3, schedule=schedule, missing=0.0)
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


ESTIMATE_STATS = STATS | {"measured": 10, "reused": 2, "pruned": 0, "estimated": 90}


@pytest.mark.parametrize("width", [80, 120, 200])
def test_an_estimate_search_shows_its_figures(width: int) -> None:
    plan = with_search(make_plan(num_layers=6, num_microbatches=4, salt="search"))
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None)
    print_plan(console, exported_chain_spec(6), plan, ESTIMATE_STATS)
    text = out.getvalue()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    for st in plan.stages:
        assert st.estimated_cost_s is not None
        assert f"{st.estimated_cost_s * 1e3:.2f}" in text, text
    if width >= 120:  # a table, the estimate its own column, each figure on one line
        assert "est ms" in next(line for line in lines if "cost ms" in line)
        assert any(
            "estimate search: 12 measured (10 layer profiles, 2 verified), 90 estimated, "
            "2 verification rounds" in line
            for line in lines
        ), text
        assert any(
            "estimate error over 8 stages: median 4.1%, max 9.8%" in line and "band 15.0%" in line
            for line in lines
        ), text
        counts = "8 distinct stages: 10 measured, 2 reused, 0 pruned, 0 failed, 90 estimated"
        assert any(counts in line for line in lines), text
        runner = next(line for line in lines if line.lstrip("│ ").startswith("runner-up"))
        assert "1 of 2 stages estimated" in runner
        baseline = next(line for line in lines if "data_parallel" in line)
        assert "1 of 1 stage estimated" in baseline
        assert "(1 of 2 stages estimated)" in text  # beside the runner-up's stages
    else:
        flat = " ".join(text.split())
        assert "estimate error over 8 stages" in flat and "1 of 2 stages estimated" in flat


def test_a_plan_without_a_search_has_no_estimate_column() -> None:
    plan = make_plan(num_layers=6, num_microbatches=4, salt="plain")
    out = io.StringIO()
    print_plan(Console(file=out, width=200, color_system=None), exported_chain_spec(6), plan, STATS)
    text = out.getvalue()
    assert "est ms" not in text and "estimate" not in text and "estimated" not in text


@pytest.mark.parametrize(
    ("summary", "expected"),
    [
        (SEARCH.model_copy(update={"compared": 0, "estimate_error_median": None}), "no stage"),
        (SearchSummary(mode="exhaustive"), "exhaustive search: measured every candidate"),
        (SearchSummary(mode="prune"), "prune search: measured every stage that could win"),
    ],
)
def test_search_lines_of_other_summaries(summary: SearchSummary, expected: str) -> None:
    plan = with_search(make_plan(num_layers=4, num_microbatches=2, salt="s"), summary)
    assert expected in " ".join(search_lines(plan))


def test_the_json_line_carries_the_search_and_each_stage_s_estimate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = with_search(make_plan(num_layers=6, num_microbatches=4, salt="json"))
    print_json_line({"plan": plan.model_dump(mode="json"), "stats": ESTIMATE_STATS})
    line = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert line["plan"]["search"] == SEARCH.model_dump(mode="json")
    assert line["stats"]["estimated"] == 90
    assert line["plan"]["runner_up"]["stages"][-1]["measured"] is False
    assert all(st["measured"] and st["estimated_cost_s"] for st in line["plan"]["stages"])
    assert Plan.model_validate(line["plan"]) == plan


def test_a_plan_that_searched_counts_prints_each_count_beside_it() -> None:
    from planner.microbatches import choose_count

    fast = make_plan(num_layers=6, num_microbatches=4, salt="fast")
    slow = make_plan(num_layers=6, num_microbatches=8, salt="slow")
    slow = slow.model_copy(
        update={"predicted_iteration_time_s": fast.predicted_iteration_time_s * 2}
    )
    plan = choose_count({4: fast, 8: slow, 16: "no stage fits"}, 32)
    out = io.StringIO()
    print_plan(Console(file=out, width=160, color_system=None), exported_chain_spec(6), plan, STATS)
    text = out.getvalue()
    assert "micro-batches searched" in text
    rows = {line.split("│")[1].strip(): line for line in text.splitlines() if "│" in line}
    assert "4 *" in rows and "8" in rows and "no stage fits" in rows["16"]
    ms = f"{fast.predicted_iteration_time_s * 1e3:.3f}"
    assert ms in rows["4 *"] and " 8 " in rows["4 *"]  # micro-batch 32 / 4
