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
