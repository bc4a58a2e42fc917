"""The command line's defaults are the schemas': `stageprof plan` and `stageprof profile`
with no option flags ask for exactly `PlanOptions()` and `ClusterSpec()`."""

import argparse

import pytest

from cli.commands.measure_args import field_argument
from cli.commands.plan import _request_parts
from cli.commands.profile import _parts
from cli.main import build_parser
from schemas import ClusterSpec, PlanOptions


def test_plan_without_flags_asks_for_the_schema_defaults() -> None:
    args = build_parser().parse_args(["plan"])
    cluster, options = _request_parts(args)
    assert options == PlanOptions()
    assert cluster == ClusterSpec()


def test_profile_without_flags_measures_with_the_schema_defaults() -> None:
    argv = ["profile", "--zoo", "mlp", "--start", "0", "--end", "0", "--submesh", "1x1"]
    args = build_parser().parse_args([*argv, "--logical-mesh", "1x1", "--strategy", "data"])
    _, _, cluster, options = _parts(args)
    assert options == PlanOptions()
    assert cluster.device_memory_bytes == ClusterSpec().device_memory_bytes


def test_a_field_flag_has_the_field_default_help_and_choices() -> None:
    parser = argparse.ArgumentParser()
    field_argument(parser, "--repeats", PlanOptions, "repeats")
    field_argument(parser, "--config-space", PlanOptions, "config_space")
    assert parser.parse_args([]).repeats == PlanOptions.model_fields["repeats"].default
    assert parser.parse_args(["--repeats", "7"]).repeats == 7
    help_text = " ".join(parser.format_help().split())
    assert "least number of timed runs per module (then adaptive) (default: 5)" in help_text
    with pytest.raises(SystemExit):
        parser.parse_args(["--config-space", "nonsense"])


@pytest.mark.parametrize("command", ["plan", "gate"])
def test_search_flags_set_the_search(command: str) -> None:
    def search_of(*argv: str) -> str:
        args = build_parser().parse_args([command, *argv])
        return _request_parts(args)[1].search

    assert search_of() == PlanOptions().search == "estimate"
    assert search_of("--exhaustive") == "exhaustive"
    assert search_of("--search", "prune") == "prune"
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--search", "prune", "--exhaustive"])
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--search", "nonsense"])


def test_the_search_flag_s_help_is_the_field_s(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["plan", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--search {estimate,prune,exhaustive}" in help_text
    assert "(default: estimate)" in help_text
    assert "--exhaustive measure every candidate (the same as --search exhaustive)" in help_text
