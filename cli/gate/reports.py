"""What CI pages show: JUnit XML (one test case per check) and a Markdown summary (a
before/after table per stage, then the checks)."""

import re
import socket
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cli.gate.verdict import (
    Check,
    Outcome,
    Remeasured,
    Verdict,
    human_bytes,
    human_flops,
    same_layout,
)
from schemas import Plan, PlannedStage
from schemas.plan import percent

SUITE = "stageprof gate"
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
ICONS = {
    Outcome.passed: "✅",
    Outcome.note: "📝",
    Outcome.failed: "❌",
    Outcome.undecided: "⚠️",
}
HEADLINES = {
    "pass": "✅ pass",
    "fail": "❌ regression",
    "undecided": "⚠️ could not decide",
}


@dataclass(frozen=True)
class GateResult:
    """Everything a report shows; `baseline`/`today` are None when they could not be read."""

    verdict: Verdict
    baseline: Plan | None = None
    today: Plan | None = None
    remeasured: Sequence[Remeasured] = ()
    job_id: str | None = None
    subject: str = ""
    wall_seconds: float = 0.0
    properties: dict[str, str] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)


def _clean(text: str) -> str:
    return _XML_BAD.sub("?", text)


def junit_xml(result: GateResult) -> str:
    """`<testsuites><testsuite>` with one `<testcase>` per check: a failed check has a
    `<failure message=...>`, an undecided one an `<error message=...>`, a note its reason
    in `<system-out>`."""
    checks = result.verdict.checks
    counts = result.verdict.counts()
    totals = {
        "tests": str(len(checks)),
        "failures": str(counts[Outcome.failed.value]),
        "errors": str(counts[Outcome.undecided.value]),
    }
    wall = f"{result.wall_seconds:.3f}"
    root = ET.Element("testsuites", {"name": SUITE, "time": wall, **totals})
    suite = ET.SubElement(
        root,
        "testsuite",
        {
            "name": SUITE + (f": {_clean(result.subject)}" if result.subject else ""),
            **totals,
            "skipped": "0",
            "time": wall,
            "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S"),
            "hostname": socket.gethostname() or "localhost",
        },
    )
    props = {"verdict": result.verdict.label, **result.properties}
    if result.job_id:
        props["job_id"] = result.job_id
    props.update({f"stats.{k}": str(v) for k, v in result.stats.items()})
    properties = ET.SubElement(suite, "properties")
    for name, value in props.items():
        ET.SubElement(properties, "property", {"name": name, "value": _clean(value)})
    for check in checks:
        suite.append(_testcase(check))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _testcase(check: Check) -> ET.Element:
    case = ET.Element(
        "testcase",
        {"name": _clean(check.name), "classname": f"stageprof.gate.{check.figure}", "time": "0"},
    )
    reason = _clean(check.reason)
    if check.outcome == Outcome.failed:
        ET.SubElement(
            case, "failure", {"message": reason, "type": check.figure.value}
        ).text = reason
    elif check.outcome == Outcome.undecided:
        ET.SubElement(case, "error", {"message": reason, "type": "undecided"}).text = reason
    else:
        ET.SubElement(case, "system-out").text = f"{check.outcome.value}: {reason}"
    return case


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def _arrow(before: str, after: str) -> str:
    return before if before == after else f"{before} → {after}"


def _mesh(st: PlannedStage) -> str:
    return f"{st.submesh} as {st.config.label()}"


def markdown(result: GateResult) -> str:
    """A GitHub/GitLab-flavoured summary: headline, per-stage before/after, checks."""
    v = result.verdict
    counts = v.counts()
    lines = [f"## stageprof gate: {HEADLINES[v.label]}", ""]
    about = f"{result.subject}, " if result.subject else ""
    job = f"job `{result.job_id}`, " if result.job_id else ""
    lines.append(
        f"{about}{job}{len(v.checks)} checks: {counts['pass']} passed, {counts['note']} "
        f"with a note, {counts['fail']} failed, {counts['undecided']} undecided."
    )
    lines.append("")
    base, today = result.baseline, result.today
    if base is not None and len(result.remeasured) == len(base.stages):
        lines += _baseline_table(base, result.remeasured)
    if base is not None and today is not None:
        spread = base.cost_spread + today.cost_spread
        lines.append(
            f"Predicted iteration time: {_ms(base.predicted_iteration_time_s)} ms → "
            f"{_ms(today.predicted_iteration_time_s)} ms (measured spread {percent(spread)})."
        )
        lines.append("")
        if not same_layout(base, today):
            lines += _today_table(today)
    lines += ["### Checks", ""]
    for check in v.checks:
        lines.append(f"- {ICONS[check.outcome]} **{_cell(check.name)}**: {_cell(check.reason)}")
    return "\n".join(lines) + "\n"


def _baseline_table(base: Plan, remeasured: Sequence[Remeasured]) -> list[str]:
    lines = [
        "| stage | layers | mesh | fwd+bwd ms | peak memory | FLOPs / device | stash | fits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, (st, got) in enumerate(zip(base.stages, remeasured, strict=True)):
        r = got.result
        head = f"| {i} | {st.start}-{st.end} | {_cell(_mesh(st))} | "
        if r is None or not r.ok:
            why = got.missing if r is None else f"{r.status}"
            lines.append(
                head + f"{_ms(st.compute_cost)} → ? | {human_bytes(st.peak_memory)} → ? | "
                f"{human_flops(st.flops)} → ? | {human_bytes(st.intermediate_size)} → ? | "
                f"{_cell(str(why))} |"
            )
            continue
        lines.append(
            head
            + " | ".join(
                [
                    _arrow(_ms(st.compute_cost), _ms(r.compute_cost)),
                    _arrow(human_bytes(st.peak_memory), human_bytes(r.peak_memory)),
                    _arrow(human_flops(st.flops), human_flops(r.flops)),
                    _arrow(human_bytes(st.intermediate_size), human_bytes(r.intermediate_size)),
                    "yes" if r.max_n_succ_stages >= len(base.stages) - 1 - i else "**no**",
                ]
            )
            + " |"
        )
    lines.append("")
    lines.append("Baseline stages, before → today (re-measured on today's run).")
    lines.append("")
    return lines


def _today_table(today: Plan) -> list[str]:
    lines = [
        "Today's plan (its layout differs from the baseline's):",
        "",
        "| stage | layers | mesh | fwd+bwd ms | peak memory | FLOPs / device | stash |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, st in enumerate(today.stages):
        lines.append(
            f"| {i} | {st.start}-{st.end} | {_cell(_mesh(st))} | {_ms(st.compute_cost)} | "
            f"{human_bytes(st.peak_memory)} | {human_flops(st.flops)} | "
            f"{human_bytes(st.intermediate_size)} |"
        )
    lines.append("")
    return lines
