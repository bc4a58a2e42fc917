"""End to end, as a model repository's CI runs it: the GitHub recipe's gate step against the
compose topology as local processes (Postgres, `stageprof db upgrade`, `stageprof serve`,
`stageprof worker`). The baseline is written with the step's flags, the same model passes,
a wider MLP fails on FLOPs/peak memory naming the stage, a stopped server is exit 2."""

import json
import secrets
import shlex
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema

from cli.gate.baseline import read_baseline
from tests.e2e.stack import STAGEPROF, LocalStack
from tests.e2e.test_ci_recipes import GITHUB, github_gate_step
from tests.e2e.test_stack import e2e_database_url, stack_env
from tests.support.processes import free_port, settings_free_env, stop_processes
from tests.support.xla_flags import with_fast_compile

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.ray, pytest.mark.timeout(600)]

XSD = Path(__file__).resolve().parents[1] / "cli" / "data" / "junit.xsd"
GATE_TIMEOUT_S = 300.0


def recipe_gate_argv(base_url: str) -> list[str]:
    """The recipe's `stageprof gate ...` step, its $STAGEPROF_URL set to the local API."""
    words = shlex.split(github_gate_step(GITHUB)["run"])
    assert words[:2] == ["stageprof", "gate"]
    return [w.replace("$STAGEPROF_URL", base_url) for w in words[1:]]


def gate(workdir: Path, env: dict[str, str], argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*STAGEPROF, *argv],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=GATE_TIMEOUT_S,
    )


def junit_cases(path: Path) -> dict[str, ET.Element]:
    xmlschema.XMLSchema(str(XSD)).validate(str(path))
    return {c.get("name") or "": c for c in ET.parse(path).getroot().iter("testcase")}


def test_the_recipe_gate_passes_fails_and_cannot_decide(tmp_path: Path) -> None:
    env = stack_env(e2e_database_url())
    token = secrets.token_urlsafe(24)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    summary = tmp_path / "step-summary.md"
    gate_env = env | {"STAGEPROF_API_TOKEN": token, "GITHUB_STEP_SUMMARY": str(summary)}
    argv = recipe_gate_argv(base)
    baseline = tmp_path / argv[argv.index("--baseline") + 1]
    junit = tmp_path / argv[argv.index("--junit") + 1]
    with LocalStack(tmp_path, env) as stack:
        stack.run("migrate", "db", "upgrade")
        api = stack.start(
            "api",
            *("serve", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
            *("--no-migrate", "--log-level", "warning"),
            env=env | {"STAGEPROF_API_TOKEN": token},
        )
        stack.start(
            "worker",
            *("worker", "--workers", "1", "--devices-per-worker", "2", "--idle-sleep", "0.5"),
        )
        stack.wait_healthy(base)

        # 1. A developer writes the baseline with the step's flags and commits it.
        write = [a for a in argv if a not in ("--baseline", str(baseline.relative_to(tmp_path)))]
        written = gate(tmp_path, gate_env, write + ["--write-baseline", str(baseline)])
        assert written.returncode == 0, written.stderr + stack.logs()
        plan = read_baseline(baseline)
        assert plan.num_layers == 4 and all(s.flops > 0 for s in plan.stages)

        # 2. CI on an unchanged model: pass, reports written, the step summary appended.
        same = gate(tmp_path, gate_env, argv + ["--json"])
        assert same.returncode == 0, same.stdout + same.stderr
        out = json.loads(same.stdout.strip().splitlines()[-1])
        assert out["verdict"] == "pass" and out["exit_code"] == 0
        cases = junit_cases(junit)
        assert "stage 0 FLOPs" in cases and not list(ET.parse(junit).getroot().iter("failure"))
        assert summary.read_text().startswith("## stageprof gate: ✅ pass")

        # 3. A wider MLP: more FLOPs and memory in every stage of the baseline's layout.
        # (overrides apply after the preset: hidden 32 becomes 64)
        wider = gate(tmp_path, gate_env, argv + ["--set", "hidden_size=64"])
        assert wider.returncode == 1, wider.stdout + wider.stderr
        failures = {
            name: case.find("failure")
            for name, case in junit_cases(junit).items()
            if case.find("failure") is not None
        }
        flops = [n for n in failures if n.endswith("FLOPs")]
        assert flops, failures
        message = failures[flops[0]].get("message") or ""  # type: ignore[union-attr]
        assert "stage 0 (layers 0-" in message and "FLOPs per device" in message
        assert "beyond the 2.0% allowed" in message
        assert "❌ regression" in summary.read_text()

        # 4. The server is gone: exit 2, one line on stderr, no traceback.
        stop_processes([api.proc], group=True)
        down = gate(tmp_path, gate_env, argv)
        assert down.returncode == 2
        assert down.stderr.count("\n") == 1 and "Traceback" not in down.stderr, down.stderr
        assert down.stderr.startswith(f"stageprof gate: cannot reach the server at {base}")
        (error,) = ET.parse(junit).getroot().iter("error")
        assert "cannot reach the server" in (error.get("message") or "")


ENTRY_MODULE = '''\
from client import zoo


def spec():
    """What a model repository's entry point returns: its model, traced."""
    return zoo.build("mlp", preset="tiny", num_layers=4)
'''


def test_the_gate_runs_embedded_on_an_entry_point(tmp_path: Path) -> None:
    """No server: the store is a SQLite file, Ray and JAX run in the gate's process; the
    model comes from `--entry module:function` imported from the working directory."""
    (tmp_path / "my_model.py").write_text(ENTRY_MODULE)
    env = settings_free_env(also=("RAY_ADDRESS", "XLA_FLAGS"))
    env["XLA_FLAGS"] = with_fast_compile("")  # device counts are the gate's own
    argv = recipe_gate_argv("unused")
    model = ["--zoo", "mlp", "--set", "preset=tiny", "--set", "num_layers=4"]
    at = argv.index("--zoo")
    assert argv[at : at + len(model)] == model  # what my_model.spec builds
    rest = argv[:at] + argv[at + len(model) :]
    at = rest.index("--server")
    embedded = [
        *rest[:at],
        *rest[at + 2 :],
        *("--entry", "my_model:spec", "--workers", "1"),
        *("--database-url", f"sqlite:///{tmp_path / 'stageprof.db'}"),
    ]
    baseline = tmp_path / "ci" / "stageprof-baseline.json"
    write = [a for a in embedded if a not in ("--baseline", "ci/stageprof-baseline.json")]
    written = gate(tmp_path, env, [*write, "--write-baseline", str(baseline)])
    assert written.returncode == 0, written.stdout + written.stderr
    assert read_baseline(baseline).num_layers == 4
    same = gate(tmp_path, env, [*embedded, "--json"])
    assert same.returncode == 0, same.stdout + same.stderr
    out = json.loads(same.stdout.strip().splitlines()[-1])
    assert out["verdict"] == "pass"
    assert {c["outcome"] for c in out["checks"]} == {"pass"}  # every figure reused: equal
