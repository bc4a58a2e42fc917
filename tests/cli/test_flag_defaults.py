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
