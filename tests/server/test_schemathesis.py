"""The OpenAPI document states what the API accepts: schemathesis against the live app.

Every check of schemathesis runs (server errors, status codes and headers documented,
responses matching their schemas, schema-violating requests refused, `Allow` on 405 and
OPTIONS, use after free in stateful sequences...), with one replaced:
`positive_data_acceptance` becomes `positive_data_within_rules`
(tests/server/schemathesis_hooks.py), which lets a schema-valid request be refused only by
the listed cross-field rules, the ones no per-field JSON Schema can state. The deprecated
`DELETE /v1/jobs/{job_id}` (cancel, kept for older clients; `POST .../cancel` is the
operation) is left out: a DELETE that leaves its resource readable is what it documents.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from migrations import upgrade
from server import Settings
from tests.server.live import LiveServer
from tests.server.schemathesis_hooks import MODELS, PLANS, PROFILES, unlisted_errors

ROOT = Path(__file__).resolve().parents[2]
MAX_EXAMPLES = 5  # per operation in the fuzzing phase; the coverage phase is exhaustive
MAX_STEPS = 4  # per stateful scenario
# One worker: with several, hypothesis's lambda descriptions can race in schemathesis's
# coverage phase (a "Runtime Error" of the engine, not of the API).
SEED = 20261125
CONFIG = f"""
[phases.stateful]
max-steps = {MAX_STEPS}
"""


def run_schemathesis(url: str, out: Path) -> dict:
    report = out / "report.json"
    config = out / "schemathesis.toml"
    config.write_text(CONFIG)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SCHEMATHESIS_HOOKS": "tests.server.schemathesis_hooks",
    }
    cmd = [
        *(sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run"),
        f"{url}/openapi.json",
        *("--checks", "all", "--exclude-checks", "positive_data_acceptance"),
        "--exclude-deprecated",
        *("--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED), "--workers", "1"),
        *("--generation-database", "none", "--no-color"),
        *("--report", "json", "--report-json-path", str(report)),
    ]
    done = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=600)
    assert report.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(report.read_text())
    result["output"] = done.stdout
    return result


@pytest.mark.slow
def test_schemathesis_finds_no_failure(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'stageprof.db'}"
    upgrade(url)
    with LiveServer(Settings(database_url=url)) as srv:
        result = run_schemathesis(srv.url, tmp_path)
    cases = result["test_cases"]
    print(f"schemathesis: {cases['generated']} cases, {cases['with_failures']} with failures")
    assert result["failures"] == [] and result["errors"] == [], result["output"][-6000:]
    assert cases["generated"] >= 500 and result["operations"]["tested"] >= 12
    assert all(result["phases"][p]["status"] == "success" for p in ("coverage", "fuzzing"))


def test_only_listed_cross_field_rules_pass() -> None:
    listed = [
        {"msg": "Value error, loss 'y' is not an output of the last layer"},
        {"msg": "Value error, give exactly one of model_id, model, zoo (got none)"},
    ]
    assert unlisted_errors(PLANS, listed) == []
    per_field = {"msg": "Value error, unsupported dtype 'x'; use one of [...]"}
    assert unlisted_errors(MODELS, [per_field]) == [per_field]
    assert unlisted_errors(PROFILES, listed) == listed  # each rule belongs to its operations
    zoo_name = {"field": "zoo.name", "msg": "unknown zoo model 'x'"}
    zoo_config = {"field": "zoo.config.num_layers", "msg": "must be at most 64, got 65"}
    assert unlisted_errors(PLANS, [zoo_name, zoo_config]) == [zoo_name]


def test_measure_stages_rules_are_listed_for_their_field_only() -> None:
    past = {
        "field": "options.measure_stages.1.end",
        "msg": "layer 3 is past the model's last layer (2): the model has 3 layers",
    }
    backwards = {
        "field": "options.measure_stages.0",
        "msg": "Value error, end (1) must be >= start (2)",
    }
    assert unlisted_errors(PLANS, [past, backwards]) == []
    elsewhere = backwards | {"field": "options.num_microbatches"}
    assert unlisted_errors(PLANS, [elsewhere]) == [elsewhere]
