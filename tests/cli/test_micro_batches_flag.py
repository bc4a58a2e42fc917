"""`stageprof plan --micro-batches`: a count, 'auto', or counts to search."""

import argparse

import pytest

from cli.commands.plan_counts import parse_micro_batches
from schemas import PlanOptions


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("8", {"num_microbatches": 8}),
        ("auto", {"microbatch_search": "auto"}),
        ("4,8,16,32", {"microbatch_search": [4, 8, 16, 32]}),
    ],
)
def test_the_flag_gives_plan_options(text: str, fields: dict) -> None:
    assert parse_micro_batches(text) == fields
    PlanOptions(**fields)  # valid options


@pytest.mark.parametrize("text", ["x", "4,x", "4.5"])
def test_a_bad_flag_names_the_forms(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_micro_batches(text)
