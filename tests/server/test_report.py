"""The standalone report (`stageprof plan --report FILE`): one self-contained HTML file.

HTML checks read the rendered string; the browser test opens the file:// page in headless
Chromium (helpers from test_browser) and saves artifacts/report.png.
"""

import json
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from sqlalchemy.orm import Session, sessionmaker

from cli.commands.plan_output import print_plan, write_report
from schemas import ClusterSpec, JobStatus, Plan, PlanOptions
from server.report import SCRIPTS, cost_matrix_url, render_job_report, stageprof_version
from store import JobRow, ModelRow, create_job, finish_job, session_scope
from tests.server.factories import (
    SeededJob,
    estimated_keys,
    exported_chain_spec,
    make_plan,
    seed_job,
)
from tests.server.test_browser import (
    ARTIFACTS,
    CHROMIUM_TIMEOUT_S,
    FLAGS,
    chromium,
    run_chromium,
)

EVIL = "</script><script>alert('x')</script>"
EVIL_LAYER = "l0<img src=x onerror=alert(1)>&amp;"
PAGE_DATA = re.compile(r'<script type="application/json" id="page-data">(.*?)</script>', re.S)


def render(db: sessionmaker[Session], job_id: str, **kwargs: Any) -> str:
    with session_scope(db, write=False) as s:
        return render_job_report(s, job_id=job_id, **kwargs)


def page_data(html: str) -> dict[str, Any]:
    found = PAGE_DATA.search(html)
    assert found is not None
    data: dict[str, Any] = json.loads(found.group(1))
    return data


def table(html: str, table_id: str) -> str:
    found = re.search(rf'<table[^>]*id="{table_id}".*?</table>', html, re.S)
    assert found is not None, table_id
    return found.group(0)


def section(html: str, section_id: str) -> str:
    found = re.search(rf'<section[^>]*id="{section_id}".*?</section>', html, re.S)
    assert found is not None, section_id
    return found.group(0)


def assert_self_contained(html: str) -> None:
    """No src/href but data: URIs and anchors, no url() but fragments, no remote text."""
    refs = re.findall(r"""\b(?:src|href)\s*=\s*["']?([^"'\s>]*)""", html, re.I)
    assert refs, "expected the data: favicon at least"
    for ref in refs:
        assert ref.startswith(("data:", "#")), ref
    for ref in re.findall(r"url\(\s*['\"]?([^)'\"]*)", html):
        assert ref.startswith("#"), ref
    assert "/static/" not in html and "@import" not in html
    assert "https://" not in html and "//cdn" not in html
    for url in re.findall(r"http://[^\s\"')]+", html):
        assert url.startswith("http://www.w3.org/2000/svg"), url  # the SVG namespace
    assert not re.search(r"<(?:link|script)[^>]*\b(?:src|href)=(?![\"']?data:)", html, re.I)


def test_report_of_a_finished_job(api: httpx.Client, db: sessionmaker[Session]) -> None:
    seeded = seed_job(db, num_layers=6, num_microbatches=4)
    assert seeded.plan is not None
    when = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
    html = render(db, seeded.job_id, generated_at=when)

    assert html.startswith("<!doctype html>")
    assert table(html, "plan-stages").count("<tr>") == 1 + len(seeded.plan.stages)
    for stage in seeded.plan.stages:
        assert f"{stage.start}–{stage.end}" in html and stage.layer_names[0] in html
    baselines = table(html, "baselines")
    assert "data_parallel" in baselines and "3 stages do not fit 2 devices" in baselines
    runner_up = seeded.plan.runner_up
    assert runner_up is not None and seeded.plan.stability == "stable"
    verdict = section(html, "plan-stability")
    assert "Plan is stable: runner-up 18.3% slower, measured spread 2.1%." in verdict
    assert table(html, "runner-up-stages").count("<tr") == 1 + len(runner_up.stages)
    assert "differs" in table(html, "runner-up-stages")
    assert 'class="badge big stability-stable"' in html  # the summary tile
    assert 'id="gantt"' in html and 'id="heatmap"' in html and 'id="heatmap-select"' in html
    assert 'id="profile-table"' not in html  # the profile table pages through the API
    assert f"{seeded.num_candidates}/{seeded.num_candidates}" in html
    assert "0 pruned" in html and "2 failed" in html
    assert 'href="/models/' not in html and seeded.model_id[:12] in html
    footer = re.search(r'<footer[^>]*id="report-footer".*?</footer>', html, re.S)
    assert footer is not None and "<a" not in footer.group(0)
    assert "2025-03-04 05:06:07 UTC" in footer.group(0)
    assert f"stageprof {stageprof_version()}" in footer.group(0)

    # Inline assets: the dashboard's stylesheet and scripts, verbatim.
    static = Path(__file__).resolve().parents[2] / "server" / "static"
    assert (static / "app.css").read_text() in html
    for name in SCRIPTS:
        assert f'<script data-source="{name}">' in html
        assert (static / name).read_text() in html
    assert html.count("<script") == 1 + len(SCRIPTS)
    assert "default-src 'none'" in html  # a CSP that forbids any network access
    assert_self_contained(html)

    # The data: the plan's schedule and stages, and exactly the API's cost-matrix answer.
    data = page_data(html)
    assert data["job_id"] == seeded.job_id and data["finished"] is True
    assert len(data["schedule"]) == len(seeded.plan.schedule) == 2 * 2 * 4
    assert [(s["start"], s["end"]) for s in data["stages"]] == [(0, 2), (3, 5)]
    url = cost_matrix_url(seeded.job_id)
    assert list(data["embedded"]) == [url]
    answer = api.get(url)
    assert answer.status_code == 200
    assert data["embedded"][url] == answer.json()
    matrices = data["embedded"][url]["matrices"]
    assert len(matrices) == 3 and all(len(m["compute_cost"]) == 6 for m in matrices)


def plan_variant(plan: Plan, variant: str) -> Plan:
    """The seeded (stable) plan as a within-noise one, a unique one, or one stored before
    stageprof assessed stability (without the fields)."""
    if variant == "within_noise":
        return plan.model_copy(update={"stability": "within_noise", "cost_spread": 0.25})
    if variant == "unique":
        return plan.model_copy(update={"stability": "unique", "runner_up": None})
    stored = plan.model_dump(mode="json")
    for name in ("cost_spread", "runner_up", "stability", "runner_up_wall_seconds"):
        del stored[name]
    return Plan.model_validate(stored)


@pytest.mark.parametrize(
    ("variant", "summary"),
    [
        ("within_noise", "Plan is within noise: runner-up 18.3% slower, measured spread 25.0%."),
        ("unique", "Plan is unique: no other plan is feasible."),
        ("old", None),
    ],
)
def test_report_and_job_page_show_the_verdict(
    api: httpx.Client, db: sessionmaker[Session], variant: str, summary: str | None
) -> None:
    seeded = seed_job(db, num_layers=6, finished=False, recorded_fraction=1.0)
    plan = plan_variant(make_plan(6, 4, "fp"), variant)
    with session_scope(db) as s:
        assert finish_job(
            s, job_id=seeded.job_id, owner="test-runner", status=JobStatus.done, plan=plan
        )
    for html in (render(db, seeded.job_id), api.get(f"/jobs/{seeded.job_id}").text):
        assert table(html, "plan-stages").count("<tr>") == 1 + len(plan.stages)
        if summary is None:
            assert 'id="plan-stability"' not in html and "badge big stability-" not in html
            continue
        verdict = section(html, "plan-stability")
        assert summary in verdict
        assert f'class="badge big stability-{plan.stability}"' in html
        assert ('id="runner-up-stages"' in html) == (plan.runner_up is not None)


def test_cli_prints_the_verdict_and_the_runner_up() -> None:
    plan = make_plan(6, 4, "fp")
    console = Console(record=True, width=200)
    stats = {
        "candidates": 10,
        "distinct_stages": 8,
        "measured": 6,
        "reused": 2,
        "pruned": 0,
        "failed": 1,
        "wall_seconds": 1.5,
    }
    print_plan(console, exported_chain_spec(6), plan, stats)
    text = console.export_text()
    assert "plan is stable: runner-up 18.3% slower, measured spread 2.1%" in text
    assert "runner-up (1f1b): 0-3 on 1x1 as 1x1/data · 4-5 on 1x1 as 1x1/data" in text
    row = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("runner-up"))
    assert "runner-up (1f1b)" in row and "+18.3%" in row
    assert "search 2.1 ms (1f1b: 1.3 ms)" in text
    assert "stageprof (1f1b)" in text
    console = Console(record=True, width=200)
    print_plan(console, exported_chain_spec(6), plan_variant(plan, "old"), stats)
    assert "plan is" not in console.export_text()


def test_report_escapes_user_text(db: sessionmaker[Session]) -> None:
    """Names stored before today's name rules (or by hand) must not become markup."""
    seeded = seed_job(db, num_layers=4)
    with session_scope(db) as s:
        model = s.get(ModelRow, seeded.model_id)
        job = s.get(JobRow, seeded.job_id)
        assert model is not None and job is not None and job.plan is not None
        model.name = EVIL
        spec = json.loads(json.dumps(model.spec))
        spec["layers"][0]["name"] = EVIL_LAYER
        model.spec = spec
        plan = json.loads(json.dumps(job.plan))
        plan["stages"][0]["layer_names"][0] = EVIL_LAYER
        job.plan = plan
        job.cluster = {**job.cluster, "device_kind": EVIL}
    html = render(db, seeded.job_id)

    assert EVIL not in html and EVIL_LAYER not in html and "<img src=x" not in html
    assert "&lt;/script&gt;&lt;script&gt;alert(&#39;x&#39;)" in html  # title, facts
    assert "l0&lt;img src=x onerror=alert(1)&gt;&amp;amp;" in table(html, "plan-stages")
    # Only our own script elements end: the embedded JSON cannot close its <script>.
    assert html.lower().count("</script") == 1 + len(SCRIPTS)
    names = page_data(html)["embedded"][cost_matrix_url(seeded.job_id)]["layer_names"]
    assert names[0] == EVIL_LAYER  # intact after JSON.parse, drawn as text by heatmap.js


def test_report_of_a_failed_job_shows_its_error(db: sessionmaker[Session]) -> None:
    with session_scope(db) as s:
        job = create_job(
            s,
            cluster=ClusterSpec(),
            options=PlanOptions(),
            zoo_name="gpt",
            zoo_config={"note": EVIL},
        )
        finish_job(s, job_id=job.id, owner=None, status=JobStatus.failed, error=f"boom {EVIL}")
        job_id = job.id
    html = render(db, job_id)
    assert 'id="no-plan"' in html and "This job ended without a plan." in html
    assert 'id="plan-stages"' not in html and 'id="gantt"' not in html
    assert "boom &lt;/script&gt;" in html and "zoo:gpt" in html and EVIL not in html
    data = page_data(html)
    assert data["schedule"] == [] and data["embedded"][cost_matrix_url(job_id)]["matrices"] == []
    assert_self_contained(html)


def test_unknown_job_is_a_value_error(db: sessionmaker[Session]) -> None:
    with pytest.raises(ValueError, match="no-such-job"):
        render(db, "no-such-job")


def test_write_report_writes_the_file(db: sessionmaker[Session], tmp_path: Path) -> None:
    seeded = seed_job(db, num_layers=3)
    path = tmp_path / "out" / "report.html"
    path.parent.mkdir()
    write_report(str(path), db, seeded.job_id)
    html = path.read_text(encoding="utf-8")
    assert html.startswith("<!doctype html>") and html.rstrip().endswith("</html>")
    assert 'id="plan-stages"' in html and page_data(html)["job_id"] == seeded.job_id
    assert "µs" in html or "ms" in html  # formatted costs, written as UTF-8
    with pytest.raises(ValueError, match="nope"):
        write_report(str(tmp_path / "nope.html"), db, "nope")
    assert not (tmp_path / "nope.html").exists()


def open_in_chromium(path: Path, profile: Path) -> tuple[str, list[str]]:
    """The DOM after the scripts ran, and the console lines Chromium logged."""
    out = subprocess.run(
        [chromium(), *FLAGS, f"--user-data-dir={profile}"]
        + ["--enable-logging=stderr", "--v=0", "--dump-dom", path.as_uri()],
        capture_output=True,
        text=True,
        timeout=CHROMIUM_TIMEOUT_S,
        check=True,
    )
    return out.stdout, [line for line in out.stderr.splitlines() if "CONSOLE" in line]


@pytest.mark.browser
def test_report_file_draws_heatmap_and_gantt_offline(
    db: sessionmaker[Session], tmp_path: Path
) -> None:
    seeded: SeededJob = seed_job(db, num_layers=8, num_microbatches=6)
    assert seeded.plan is not None
    report = tmp_path / "report.html"
    write_report(str(report), db, seeded.job_id)

    dom, console = open_in_chromium(report, tmp_path / "dom")
    bad = [line for line in console if re.search(r"Uncaught|Error|Refused", line)]
    assert not bad, console
    assert table(dom, "plan-stages").count("<tr>") == 1 + len(seeded.plan.stages)
    # 8 layers: 36 (start, end) cells in the plan's submesh/config, one failed (oom).
    assert len(re.findall(r'class="heat-cell (?:ok|failed|pending|pruned)"', dom)) == 36
    assert len(re.findall(r'class="heat-cell failed"', dom)) == 1
    assert len(re.findall(r'class="plan-cell"', dom)) == len(seeded.plan.stages)
    select = re.search(r'<select id="heatmap-select">.*?</select>', dom, re.S)
    assert select is not None and select.group(0).count("<option") == 3
    bars = re.findall(r'class="gantt-bar (fwd|bwd)"', dom)
    assert len(bars) == len(seeded.plan.schedule) == 2 * 2 * 6
    note = re.search(r'id="heatmap-note">([^<]*)<', dom)
    assert note is not None and note.group(1).startswith("8 layers · 1 device(s)"), note

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    run_chromium(
        tmp_path / "shot", f"--screenshot={shot}", "--window-size=1400,1700", report.as_uri()
    )
    assert shot.stat().st_size > 20_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.browser
def test_report_file_of_a_failed_job_has_no_script_errors(
    db: sessionmaker[Session], tmp_path: Path
) -> None:
    with session_scope(db) as s:
        job = create_job(s, cluster=ClusterSpec(), options=PlanOptions(), zoo_name="gpt")
        finish_job(s, job_id=job.id, owner=None, status=JobStatus.failed, error="no devices")
        job_id = job.id
    report = tmp_path / "failed.html"
    write_report(str(report), db, job_id)
    dom, console = open_in_chromium(report, tmp_path / "dom")
    assert not [line for line in console if re.search(r"Uncaught|Error|Refused", line)], console
    assert "No stage candidates recorded yet." in dom and "no devices" in dom


def test_report_of_an_estimate_search(db: sessionmaker[Session]) -> None:
    seeded = seed_job(db, num_layers=6, estimated=True)
    assert seeded.plan is not None and seeded.plan.search is not None
    html = render(db, seeded.job_id)
    assert_self_contained(html)
    text = " ".join(re.sub(r"<[^>]+>", " ", section(html, "plan-search")).split())
    assert "12 stages measured: 10 layer profiles, 2 verified" in text
    assert "4.1% median estimate error, max 9.8%, over 8 stages" in text
    assert "15.0% error band trusted" in text
    stages = table(html, "plan-stages")
    assert ">Estimate</th>" in stages and stages.count('class="badge measured"') == 2
    runner_up = table(html, "runner-up-stages")
    assert runner_up.count('class="badge estimated"') == 1
    assert (
        runner_up.count('class="differs estimated"') + runner_up.count('class="same estimated"')
        == 1
    )
    assert "1 of 1 stage estimated" in table(html, "baselines")
    matrices = page_data(html)["embedded"][cost_matrix_url(seeded.job_id)]["matrices"]
    statuses = {st for m in matrices for row in m["status"] for st in row}
    assert "estimated" in statuses
    assert all(len(m["estimated_cost"]) == 6 for m in matrices)


@pytest.mark.browser
def test_report_file_draws_estimated_stages_offline(
    db: sessionmaker[Session], tmp_path: Path
) -> None:
    seeded = seed_job(db, num_layers=6, estimated=True)
    assert seeded.plan is not None
    report = tmp_path / "report.html"
    write_report(str(report), db, seeded.job_id)
    dom, console = open_in_chromium(report, tmp_path / "dom")
    assert not [line for line in console if re.search(r"Uncaught|Error|Refused", line)], console
    never = estimated_keys(6, make_plan(6, 4, "fp"))
    shown = [k for k in never if k[2:] == (0, 0)]  # the heatmap shows the plan's submesh/config
    assert shown and len(re.findall(r'class="heat-cell estimated"', dom)) == len(shown)
    assert re.search(r'class="tick legend-key">estimated<', dom)


def test_report_and_job_page_show_the_layers_outside_the_pipeline(
    api: httpx.Client, db: sessionmaker[Session]
) -> None:
    """A plan running embedding and head outside the pipeline lists them with their time per
    iteration (compute × micro-batches); a plan without any shows no such section."""
    seeded = seed_job(db, num_layers=6, finished=False, recorded_fraction=1.0)
    plain = make_plan(6, 4, "fp")
    inner = make_plan(4, 4, "fp")
    first, last = inner.stages[0], inner.stages[-1]
    outside = [
        first.model_copy(update={"start": 0, "end": 0, "layer_names": ["wte"]}),
        last.model_copy(update={"start": 5, "end": 5, "layer_names": ["ln_f"]}),
    ]
    outside_time = sum(st.compute_cost for st in outside) * 4
    plan = plain.model_copy(update={"outside": outside, "outside_time_s": outside_time})
    with session_scope(db) as s:
        assert finish_job(
            s, job_id=seeded.job_id, owner="test-runner", status=JobStatus.done, plan=plan
        )
    for html in (render(db, seeded.job_id), api.get(f"/jobs/{seeded.job_id}").text):
        rows = table(html, "plan-outside-stages")
        assert rows.count("<tr>") == 1 + 2
        assert "wte" in rows and "ln_f" in rows and rows.count('class="badge measured"') == 2
        text = " ".join(re.sub(r"<[^>]+>", " ", section(html, "plan-outside")).split())
        assert "2 layers run on every device before and after the pipeline" in text
        assert "once per micro-batch (4)" in text
    seeded = seed_job(db, num_layers=6)
    assert 'id="plan-outside"' not in render(db, seeded.job_id)
