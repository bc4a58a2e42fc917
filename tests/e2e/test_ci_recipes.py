"""examples/ci/*.yml agree with the CLI and the compose file (no CI system or Docker engine
needed): their `stageprof gate` commands parse with the CLI's parser, they start the repo's
compose stack with --wait and the tokens it requires (made up, no secrets), upload the
reports the gate writes, and tear the stack down whatever happened."""

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
GITHUB = yaml.safe_load((ROOT / "examples/ci/github-actions.yml").read_text())
GITLAB = yaml.safe_load((ROOT / "examples/ci/gitlab-ci.yml").read_text())
COMPOSE_TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE = yaml.safe_load(COMPOSE_TEXT)


def github_steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    (job,) = workflow["jobs"].values()
    return list(job["steps"])


def github_gate_step(workflow: dict[str, Any]) -> dict[str, Any]:
    """The one step that runs `stageprof gate`."""
    (step,) = [s for s in github_steps(workflow) if "stageprof gate" in s.get("run", "")]
    return step


def gitlab_job() -> dict[str, Any]:
    (job,) = GITLAB.values()
    return dict(job)


def gate_args(command: str) -> list[str]:
    """The arguments of the `stageprof gate` in a shell line (after `docker exec ...`,
    before `|| ...`)."""
    words = shlex.split(command.split("||")[0])
    at = words.index("stageprof")
    assert words[at + 1] == "gate", command
    return words[at + 1 :]


def parse(args: list[str]) -> argparse.Namespace:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"`stageprof {shlex.join(args)}` does not parse: {err.getvalue()}")


def gitlab_gate_command() -> str:
    (line,) = [s for s in gitlab_job()["script"] if "stageprof gate" in s]
    return str(line)


def required_compose_variables() -> set[str]:
    """Variables the compose file refuses to start without (`${NAME:?message}`)."""
    return set(re.findall(r"\$\{([A-Z_]+):\?", COMPOSE_TEXT))


def test_both_recipes_run_the_same_gate_and_it_parses() -> None:
    github = parse(gate_args(github_gate_step(GITHUB)["run"]))
    gitlab = parse(gate_args(gitlab_gate_command()))
    for args in (github, gitlab):
        assert args.command == "gate"
        assert args.baseline == Path("ci/stageprof-baseline.json")
        assert args.junit == Path("reports/stageprof-gate.xml")
        assert args.markdown == Path("reports/stageprof-gate.md")
        assert args.write_baseline is None  # CI compares; baselines are refreshed on purpose
        assert (args.max_slowdown, args.max_growth) == (0.05, 0.02)
    ignore = {"server"}
    assert {k: v for k, v in vars(github).items() if k not in ignore} == {
        k: v for k, v in vars(gitlab).items() if k not in ignore
    }


def test_the_gate_reaches_the_api_the_compose_file_publishes() -> None:
    (serve,) = [w for w in COMPOSE["services"]["api"]["command"] if w == "serve"]
    port = COMPOSE["services"]["api"]["command"][
        COMPOSE["services"]["api"]["command"].index("--port") + 1
    ]
    assert serve and f"{port}:{port}" in COMPOSE["services"]["api"]["ports"]
    assert GITHUB["env"]["STAGEPROF_URL"] == f"http://127.0.0.1:{port}"
    assert '--server "$STAGEPROF_URL"' in github_gate_step(GITHUB)["run"]
    assert parse(gate_args(gitlab_gate_command())).server == f"http://api:{port}"


def test_the_stack_starts_with_wait_and_made_up_tokens() -> None:
    required = required_compose_variables()
    assert required == {"STAGEPROF_API_TOKEN", "RAY_AUTH_TOKEN"}
    github_up = [line for s in github_steps(GITHUB) for line in s.get("run", "").splitlines()]
    assert [u for u in github_up if " up " in u] == [
        "docker compose up -d --wait --build --scale worker=1"
    ]
    gitlab_up = [u for u in gitlab_job()["before_script"] if " up " in u]
    assert gitlab_up == ["$COMPOSE up -d --wait --build --scale worker=1"]
    compose = gitlab_job()["variables"]["COMPOSE"]
    assert compose.startswith("docker compose ") and "-f stageprof/docker-compose.yml" in compose
    github_text = "\n".join(s.get("run", "") for s in github_steps(GITHUB)).replace("\\\n", " ")
    gitlab_text = "\n".join(gitlab_job()["before_script"])
    for text in (github_text, gitlab_text):
        (env_line,) = [line for line in text.splitlines() if "> " in line and ".env" in line]
        for name in required:
            assert f"{name}=%s" in env_line  # written to the .env compose reads
        assert "openssl rand" in text
    raw = (ROOT / "examples/ci/github-actions.yml").read_text()
    assert "secrets." not in raw
    # The gate reads the API token the stack was started with.
    assert 'echo "STAGEPROF_API_TOKEN=$STAGEPROF_API_TOKEN" >> "$GITHUB_ENV"' in github_text
    assert "-e STAGEPROF_API_TOKEN" in gitlab_gate_command()


def test_github_uses_the_repos_compose_file_and_tears_it_down() -> None:
    steps = github_steps(GITHUB)
    checkout = [s for s in steps if s.get("with", {}).get("path") == "stageprof"]
    assert checkout and checkout[0]["uses"].startswith("actions/checkout@")
    compose_steps = [s for s in steps if "docker compose" in s.get("run", "")]
    assert {s["working-directory"] for s in compose_steps} == {"stageprof"}
    (down,) = [s for s in steps if "compose down" in s.get("run", "")]
    assert down["if"] == "always()" and steps.index(down) == len(steps) - 1
    (upload,) = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert upload["if"] == "always()"
    gate = parse(gate_args(github_gate_step(GITHUB)["run"]))
    assert str(gate.junit).startswith(upload["with"]["path"])
    assert str(gate.markdown).startswith(upload["with"]["path"])
    assert steps.index(upload) > steps.index(github_gate_step(GITHUB))


def test_gitlab_publishes_the_junit_report_and_tears_down_in_after_script() -> None:
    job = gitlab_job()
    gate = parse(gate_args(gitlab_gate_command()))
    assert job["artifacts"]["when"] == "always"
    assert job["artifacts"]["reports"]["junit"] == str(gate.junit)
    assert any(str(gate.markdown).startswith(p) for p in job["artifacts"]["paths"])
    assert any("-f stageprof/docker-compose.yml down" in s for s in job["after_script"])
    script = job["script"]
    # The gate's exit code survives copying the reports out: 1 fails the job.
    assert gitlab_gate_command().rstrip().endswith("|| status=$?")
    assert script[-1] == "exit $status"
    workdir = shlex.split(gitlab_gate_command())[shlex.split(gitlab_gate_command()).index("-w") + 1]
    assert f"docker cp stageprof-gate:{workdir}/reports ./reports" in script
    baseline_in = f"stageprof-gate:{workdir}/{gate.baseline}"
    assert any(s.startswith("docker cp ci/") and s.endswith(baseline_in) for s in script)
    # The image's user (Dockerfile USER) owns that directory: its home.
    user = re.findall(r"^USER (\S+)$", (ROOT / "Dockerfile").read_text(), re.M)[-1]
    assert workdir.startswith(f"/home/{user}/")
