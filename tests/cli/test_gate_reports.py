"""The gate's reports: JUnit XML valid against the schema CI tools read (one test case per
check, failures with a message naming the stage), Markdown before/after tables, baselines."""

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema

from cli.gate.baseline import BaselineError, read_baseline, write_baseline
from cli.gate.reports import GateResult, junit_xml, markdown
from cli.gate.verdict import Outcome, Remeasured, decide, undecided
from tests.cli.test_gate_verdict import BASE, TOL, measured, plan_of, same_as, stage

XSD = Path(__file__).parent / "data" / "junit.xsd"


@pytest.fixture(scope="module")
def schema() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(XSD))


def regression() -> GateResult:
    today = plan_of([stage(0, 0), stage(1, 3)], time_s=0.070)
    remeasured = [measured(BASE.stages[0]), measured(BASE.stages[1], flops=3e9)]
    verdict = decide(BASE, today, remeasured, TOL)
    return GateResult(
        verdict=verdict,
        baseline=BASE,
        today=today,
        remeasured=remeasured,
        job_id="job123",
        subject='zoo mlp (ffn_size=256) <wide> & "quoted"',
        wall_seconds=12.5,
        properties={"server": "http://127.0.0.1:8000"},
        stats={"measured": 7},
    )


def test_junit_is_valid_and_has_one_case_per_check(schema: xmlschema.XMLSchema) -> None:
    result = regression()
    text = junit_xml(result)
    schema.validate(text)
    root = ET.fromstring(text)
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [c.name for c in result.verdict.checks]
    failures = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    assert set(failures) == {"iteration time", "baseline stage 1 FLOPs"}
    flops = failures["baseline stage 1 FLOPs"]
    assert flops is not None
    message = flops.get("message") or ""
    assert message.startswith("baseline stage 1 (layers 2-3 on 1x1 as 1x1/data): FLOPs")
    assert suite.get("failures") == root.get("failures") == "2"
    assert suite.get("tests") == str(len(cases)) and suite.get("errors") == "0"
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["verdict"] == "fail" and props["job_id"] == "job123"
    assert props["stats.measured"] == "7"
    assert suite.get("name") == 'stageprof gate: zoo mlp (ffn_size=256) <wide> & "quoted"'


def test_junit_of_an_undecided_run_has_an_error_case(schema: xmlschema.XMLSchema) -> None:
    text = junit_xml(GateResult(verdict=undecided("cannot reach the server \x1b[31mred")))
    schema.validate(text)
    (case,) = ET.fromstring(text).iter("testcase")
    error = case.find("error")
    assert error is not None and error.get("message") == "cannot reach the server ?[31mred"


def test_the_schema_rejects_what_ci_tools_would_not_read(schema: xmlschema.XMLSchema) -> None:
    """The schema is a real check: a case without a name, or a count that is no number,
    is refused."""
    assert not schema.is_valid(
        '<testsuites><testsuite name="s" tests="1" failures="0" errors="0">'
        '<testcase classname="c"/></testsuite></testsuites>'
    )
    assert not schema.is_valid(
        '<testsuites><testsuite name="s" tests="one" failures="0" errors="0">'
        "</testsuite></testsuites>"
    )


def test_markdown_shows_before_and_after_per_stage_and_every_check() -> None:
    result = regression()
    text = markdown(result)
    assert text.startswith("## stageprof gate: ❌ regression\n")
    assert "job `job123`" in text and "2 failed" in text
    # The baseline's stages, then → today's measurement of them
    assert "| 1 | 2-3 | 1x1 as 1x1/data | 10 | 8 MiB | 1 GFLOP → 3 GFLOP | 1 MiB | yes |" in text
    assert "Predicted iteration time: 50 ms → 70 ms" in text
    assert "Today's plan (its layout differs" in text  # layout changed: today's table too
    for check in result.verdict.checks:
        assert f"**{check.name}**" in text
    assert "❌ **baseline stage 1 FLOPs**" in text


def test_markdown_says_why_a_stage_was_not_re_measured() -> None:
    missing = [Remeasured(missing="pruned: cannot be in a better plan"), measured(BASE.stages[1])]
    verdict = decide(BASE, BASE, missing, TOL)
    text = markdown(GateResult(verdict=verdict, baseline=BASE, today=BASE, remeasured=missing))
    assert "| 0 | 0-1 | 1x1 as 1x1/data | 10 → ? |" in text
    assert "pruned: cannot be in a better plan |" in text


def plan_json_line(plan: object) -> str:
    """What `stageprof plan --json` prints last."""
    return json.dumps({"job_id": "j1", "plan": plan, "stats": {"measured": 3}})


def test_baselines_are_read_from_plan_and_gate_outputs(tmp_path: Path) -> None:
    dumped = BASE.model_dump(mode="json")
    forms = {
        "plan-json.json": plan_json_line(dumped),
        "piped.json": "stageprof planning ...\nsome table\n" + plan_json_line(dumped) + "\n",
        "bare.json": json.dumps(dumped),
    }
    for name, text in forms.items():
        path = tmp_path / name
        path.write_text(text)
        assert read_baseline(path) == BASE, name
    written = tmp_path / "ci" / "baseline.json"
    write_baseline(written, BASE, job_id="j2", source={"model": "zoo mlp"})
    assert read_baseline(written) == BASE
    doc = json.loads(written.read_text())
    assert doc["job_id"] == "j2" and doc["source"] == {"model": "zoo mlp"}
    assert "schedule" not in doc["plan"]  # long and derived: kept out of the committed file


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot read baseline"),
        ("not json at all", "holds no JSON object"),
        (json.dumps({"job_id": "j", "plan": None, "error": "oom"}), "run without a plan: oom"),
        (plan_json_line({"stages": []}), "is not a plan: stages"),
    ],
)
def test_unreadable_baselines_say_why_on_one_line(
    tmp_path: Path, text: str | None, message: str
) -> None:
    path = tmp_path / "baseline.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(BaselineError, match=message) as err:
        read_baseline(path)
    assert "\n" not in str(err.value)


def test_old_baselines_without_flops_still_load(tmp_path: Path) -> None:
    dumped = BASE.model_dump(mode="json")
    for st in dumped["stages"]:
        del st["flops"]
    path = tmp_path / "old.json"
    path.write_text(plan_json_line(dumped))
    old = read_baseline(path)
    assert [s.flops for s in old.stages] == [0.0, 0.0]
    verdict = decide(old, BASE, same_as(BASE), TOL)
    assert verdict.exit_code == 0
    assert {c.outcome for c in verdict.checks if "FLOPs" in c.name} == {Outcome.note}
