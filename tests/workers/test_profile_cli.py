"""`stageprof profile`: one candidate measured in-process, printed as a table or JSON."""

import pytest

from cli.commands.profile import ensure_cpu_devices, parse_pair
from cli.main import main
from schemas import ProfileStatus, StageProfileResult

TINY = ["--zoo", "mlp", "--set", "preset=tiny", "--repeats", "2", "--max-repeats", "2"]


def test_json_prints_the_stage_profile_result(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["profile", *TINY, "--start", "0", "--end", "1", "--submesh", "1x4"]
    rc = main([*argv, "--logical-mesh", "2x2", "--strategy", "megatron", "--json"])
    out = capsys.readouterr().out
    result = StageProfileResult.model_validate_json(out)
    assert rc == 0
    assert result.status == ProfileStatus.ok
    assert result.config.logical_mesh == (2, 2) and result.config.strategy == "megatron"
    assert result.submesh.num_devices == 4
    assert len(result.module_profile_results) == 5  # schedule auto: B and W measured too
    assert result.weight_stash_size > 0
    assert all(len(m.compute_cost_samples_s) == 2 for m in result.module_profile_results)
    assert result.input_shardings["layer0/w1"] == "P(None, 'tensor')"


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["profile", *TINY, "--start", "1", "--end", "1", "--submesh", "1x2"]
    rc = main([*argv, "--logical-mesh", "2x1", "--strategy", "fsdp", "--optimizer", "sgd"])
    out = capsys.readouterr().out
    assert rc == 0
    words = ("forward", "backward", "apply_grad", "backward_input", "backward_weight")
    for word in (*words, "weight_stash_size", "max_n_succ_stages", "layer1/w1", "ok"):
        assert word in out


def test_a_failed_candidate_still_prints_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["profile", *TINY, "--start", "0", "--end", "1", "--submesh", "1x2"]
    rc = main([*argv, "--logical-mesh", "2x1", "--strategy", "data", "--device-memory-gib", "1e-6"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "oom" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--submesh", "12", "--logical-mesh", "2x1"], "--submesh must look like AxB"),
        (["--submesh", "1x2", "--logical-mesh", "4x1"], "has 4 devices but --submesh"),
        (["--submesh", "1x3", "--logical-mesh", "3x1"], "power of two"),
        (["--submesh", "1x2", "--logical-mesh", "2x1", "--end", "9"], "start <= end < 2"),
        (["--submesh", "1x2", "--logical-mesh", "2x1", "--set", "nope=1"], "unknown override"),
        (["--submesh", "2x2", "--logical-mesh", "4x1", "--hosts", "1"], "does not fit"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    argv = ["profile", *TINY, "--start", "0", "--end", "1", "--strategy", "data", *args]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_parse_pair() -> None:
    assert parse_pair("2x4", "--submesh") == (2, 4)
    assert parse_pair(" 1 X 8 ", "--submesh") == (1, 8)
    with pytest.raises(ValueError, match="--logical-mesh"):
        parse_pair("2*4", "--logical-mesh")


def test_ensure_cpu_devices_respects_an_existing_count() -> None:
    env: dict[str, str] = {}
    ensure_cpu_devices(4, env)
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=4"
    env = {"XLA_FLAGS": "--foo --xla_force_host_platform_device_count=2"}
    ensure_cpu_devices(8, env)
    assert env["XLA_FLAGS"] == "--foo --xla_force_host_platform_device_count=2"
    env = {"XLA_FLAGS": "--foo"}
    ensure_cpu_devices(8, env)
    assert env["XLA_FLAGS"] == "--foo --xla_force_host_platform_device_count=8"


def test_a_fresh_process_gets_the_virtual_devices_it_needs() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    argv = ["profile", *TINY, "--start", "0", "--end", "0", "--submesh", "1x4"]
    proc = subprocess.run(
        [sys.executable, "-m", "cli", *argv, "--logical-mesh", "4x1", "--strategy", "data"]
        + ["--json"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = StageProfileResult.model_validate_json(proc.stdout)
    assert result.ok and result.submesh.num_devices == 4
