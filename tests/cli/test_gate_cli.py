"""`stageprof gate` through `cli.main.main`: its flags are `stageprof plan`'s plus its own,
and everything that leaves it undecided exits 2 with one line on stderr and reports that say
so. (Exit 0 and 1 on real jobs: tests/e2e/test_gate.py.)"""

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema

from cli.gate.command import fraction
from cli.gate.source import GateError, load_entry
from cli.main import build_parser, main
from schemas import ModelSpec, PlanOptions, PlanRequest
from tests.cli.test_gate_verdict import BASE
from tests.support.processes import free_port

XSD = Path(__file__).parent / "data" / "junit.xsd"
TINY = ["--zoo", "mlp", "--set", "preset=tiny", "--devices-per-host", "2"]


def subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


@pytest.fixture
def baseline(tmp_path: Path) -> Path:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"job_id": "j", "plan": BASE.model_dump(mode="json")}))
    return path


def test_gate_takes_every_flag_of_plan_and_its_own() -> None:
    plan, gate = options(subparser("plan")), options(subparser("gate"))
    assert plan <= gate
    assert gate - plan == {
        "--entry",
        "--baseline",
        "--write-baseline",
        "--max-slowdown",
        "--max-growth",
        "--junit",
        "--markdown",
        "--prune",
        "--wait-timeout",
    }
    args = build_parser().parse_args(["gate", "--baseline", "b.json"])
    assert args.zoo is None  # a gate names its model; plan's default (gpt) is not taken
    assert (args.max_slowdown, args.max_growth) == (0.05, 0.02)


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["gate", "--help"])
    out = capsys.readouterr().out
    for line in ("0  pass", "1  regression", "2  could not decide"):
        assert line in out


@pytest.mark.parametrize(("text", "value"), [("5%", 0.05), ("0.05", 0.05), ("12.5%", 0.125)])
def test_tolerances_take_percentages_or_fractions(text: str, value: float) -> None:
    assert fraction(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["five", "-1%", "nan"])
def test_bad_tolerances_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        fraction(text)


def one_stderr_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_a_stopped_server_exits_2_with_one_line_and_reports_it(
    tmp_path: Path, baseline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = f"http://127.0.0.1:{free_port()}"
    junit, summary = tmp_path / "gate.xml", tmp_path / "summary.md"
    code = main(
        [
            "gate",
            *TINY,
            *("--server", server, "--baseline", str(baseline)),
            *("--junit", str(junit), "--markdown", str(summary), "--json"),
        ]
    )
    assert code == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    line = captured.err.strip()
    assert line.startswith(f"stageprof gate: cannot reach the server at {server}: ")
    out = json.loads(captured.out.strip().splitlines()[-1])
    assert out["verdict"] == "undecided" and out["exit_code"] == 2 and out["plan"] is None
    xmlschema.XMLSchema(str(XSD)).validate(str(junit))
    error = ET.parse(junit).getroot().find("testsuite/testcase/error")
    assert error is not None and "cannot reach the server" in (error.get("message") or "")
    assert summary.read_text().startswith("## stageprof gate: ⚠️ could not decide")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--baseline", "{missing}"], "cannot read baseline"),
        (["--baseline", "{garbage}"], "holds no JSON object"),
        ([], "give --baseline FILE to compare with, or --write-baseline FILE"),
        (["--baseline", "{baseline}", "--micro-batches", "0"], "num_microbatches"),
        (["--baseline", "{baseline}", "--set", "oops"], "--set expects K=V"),
    ],
)
def test_bad_input_exits_2_before_any_job(
    tmp_path: Path,
    baseline: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    garbage = tmp_path / "garbage.json"
    garbage.write_text("<html>")
    paths = {"missing": tmp_path / "nope.json", "garbage": garbage, "baseline": baseline}
    argv = [a.format(**{k: str(v) for k, v in paths.items()}) for a in argv]
    # An unreachable server: nothing may be submitted before the input is checked.
    server = f"http://127.0.0.1:{free_port()}"
    assert main(["gate", *TINY, "--server", server, *argv]) == 2
    line = one_stderr_line(capsys)
    assert line.startswith("stageprof gate: ") and message in line
    assert "cannot reach" not in line


def test_a_model_must_be_named_once(
    baseline: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["gate", "--baseline", str(baseline)]) == 2
    assert "give exactly one of --zoo, --model, --entry (got none)" in one_stderr_line(capsys)
    argv = ["gate", "--zoo", "mlp", "--entry", "m:f", "--baseline", str(baseline)]
    assert main(argv) == 2
    assert "(got --zoo, --entry)" in one_stderr_line(capsys)


def write_module(tmp_path: Path, body: str) -> None:
    (tmp_path / "gate_entry_mod.py").write_text(body)


def test_an_entry_point_returns_a_traced_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_module(
        tmp_path,
        "from client import zoo\n\ndef build():\n    return zoo.build('mlp', preset='tiny')\n",
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = load_entry("gate_entry_mod:build")
    assert isinstance(spec, ModelSpec) and spec.num_layers == 2


@pytest.mark.parametrize(
    ("ref", "body", "message"),
    [
        ("nocolon", "", "expects module:function"),
        ("gate_entry_mod:missing", "x = 1\n", "AttributeError"),
        ("gate_entry_mod:x", "x = 1\n", "is not a function"),
        ("gate_entry_mod:f", "def f():\n    return {'layers': []}\n", "returned dict, not a"),
        ("gate_entry_mod:f", "def f():\n    raise RuntimeError('boom\\nmore')\n", "boom"),
        ("no_such_module_here:f", "", "ModuleNotFoundError"),
    ],
)
def test_a_bad_entry_point_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ref: str, body: str, message: str
) -> None:
    write_module(tmp_path, body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "gate_entry_mod", raising=False)
    with pytest.raises(GateError, match=message) as err:
        load_entry(ref)
    assert "\n" not in str(err.value)


class Stop(Exception):
    pass


def asked_keys(options: PlanOptions) -> list[tuple[int, int, int, int]]:
    return [k.as_tuple() for k in options.measure_stages]


@pytest.fixture
def mlp_file(tmp_path: Path) -> Path:
    """The tiny MLP (2 layers) as a spec file: BASE's second stage (layers 2-3) is past it."""
    from client import zoo

    path = tmp_path / "mlp.json"
    path.write_text(zoo.build("mlp", preset="tiny").model_dump_json())
    return path


def test_todays_request_asks_to_measure_the_baseline_stages(
    baseline: Path, mlp_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a server: the zoo model (built by the runner) gets every baseline stage; a spec
    file's model only those within its layers; --write-baseline alone asks for none."""
    requests: list[PlanRequest] = []

    def run_remote(server: str, token: str | None, request: PlanRequest, *a, **k) -> None:
        requests.append(request)
        raise GateError("stopped before submitting")

    monkeypatch.setattr("cli.gate.remote.run_remote", run_remote)
    server = ["--server", "http://127.0.0.1:9"]
    assert main(["gate", *TINY, *server, "--baseline", str(baseline)]) == 2
    every = [(s.start, s.end, s.submesh_id, s.config_id) for s in BASE.stages]
    assert every == [(0, 1, 0, 0), (2, 3, 0, 0)]
    assert asked_keys(requests[-1].options) == every
    file = ["--model", str(mlp_file), "--devices-per-host", "2", *server]
    assert main(["gate", *file, "--baseline", str(baseline)]) == 2
    assert asked_keys(requests[-1].options) == [(0, 1, 0, 0)]
    written = baseline.parent / "new.json"
    assert main(["gate", *file, "--write-baseline", str(written)]) == 2
    assert asked_keys(requests[-1].options) == []
    both = ["--baseline", str(baseline), "--write-baseline", str(written)]
    assert main(["gate", *TINY, *server, *both]) == 2
    assert asked_keys(requests[-1].options) == every


def test_the_embedded_job_asks_to_measure_the_baseline_stages(
    baseline: Path, mlp_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Embedded: the job queued in the store asks for the baseline stages within the model."""
    from sqlalchemy.exc import SQLAlchemyError

    queued: list[PlanOptions] = []

    def queue(url: str | None, spec: ModelSpec, cluster: object, options: PlanOptions) -> None:
        queued.append(options)
        raise SQLAlchemyError("stopped before queueing")

    monkeypatch.setattr("workers.cluster.ray_env.connect_ray", lambda: None)
    monkeypatch.setattr("cli.commands.plan.queue_embedded_job", queue)
    argv = ["gate", "--model", str(mlp_file), "--devices-per-host", "2"]
    db = ["--database-url", f"sqlite:///{tmp_path / 'unused.db'}"]
    assert main([*argv, *db, "--baseline", str(baseline)]) == 2
    assert asked_keys(queued[-1]) == [(0, 1, 0, 0)]
    assert main([*argv, *db, "--write-baseline", str(tmp_path / "new.json")]) == 2
    assert asked_keys(queued[-1]) == []
