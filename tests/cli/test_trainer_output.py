"""What `plan --for maxtext|jaxpp` prints and puts in `--json`."""

import io

from rich.console import Console

from cli.commands.plan import _request_parts
from cli.commands.trainer_output import print_trainer, trainer_json
from cli.main import build_parser
from tests.planner.trainer_helpers import gpt_plan


def _printed(plan) -> str:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    print_trainer(Console(file=out, width=200), plan)
    return out.getvalue()


def test_for_flag_sets_the_target() -> None:
    args = build_parser().parse_args(["plan", "--for", "maxtext"])
    assert _request_parts(args)[1].target == "maxtext"
    args = build_parser().parse_args(["plan"])
    assert _request_parts(args)[1].target is None


def test_maxtext_settings_printed_and_in_json() -> None:
    plan = gpt_plan(16, 2, 4, target="maxtext")
    text = _printed(plan)
    mt = plan.maxtext
    assert mt is not None
    for key, value in mt.settings.items():
        assert f"{key}: {value}" in text and f"{key}={value}" in text
    assert "MaxText's best:" in text and "unrestricted best:" in text
    payload = trainer_json(plan)["maxtext"]
    assert payload["settings"] == mt.settings
    assert payload["predicted_iteration_time_s"] == mt.predicted_iteration_time_s


def test_no_maxtext_plan_says_why() -> None:
    plan = gpt_plan(13, 1, 4, target="maxtext")
    assert "no MaxText plan: no uniform plan of the 13 blocks" in _printed(plan)
    assert trainer_json(plan)["maxtext"]["settings"] is None


def test_jaxpp_snippet_printed() -> None:
    plan = gpt_plan(6, 1, 4, schedule="1f1b", target="jaxpp")
    text = _printed(plan)
    assert f"Std1F1B(num_stages={len(plan.stages)})" in text
    assert text.count("pipeline_enter_stage(x)") == len(plan.stages)
    assert trainer_json(plan)["jaxpp"]["stage_marks"][-1]["after_layer"] == "head"
    assert _printed(gpt_plan(6, 1, 4, schedule="1f1b")) == ""


def test_gate_shows_and_reports_the_target(capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from cli.gate.command import _print_checks, _print_json
    from cli.gate.reports import GateResult
    from cli.gate.verdict import Verdict

    plan = gpt_plan(16, 1, 4, target="maxtext")
    result = GateResult(verdict=Verdict(checks=()), today=plan)
    _print_json(result)
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert plan.maxtext is not None
    assert line["maxtext"]["settings"] == plan.maxtext.settings
    out = io.StringIO()
    _print_checks(Console(file=out, width=200), result)
    assert "num_pipeline_repeats=" in out.getvalue()
