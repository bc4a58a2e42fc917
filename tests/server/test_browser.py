"""Headless Chromium opens a finished job's page: the plan table, heatmap and Gantt are drawn.

Uses Debian's `chromium` directly (scripts/ensure_chromium.sh installs it); the screenshot
is saved as artifacts/job_page.png.
"""

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from migrations import upgrade
from server import Settings
from store import make_engine, make_sessionmaker
from tests.server.factories import SeededJob, estimated_keys, make_plan, seed_job
from tests.server.live import LiveServer

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
CHROMIUM_TIMEOUT_S = 120
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=5000",
]


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("chromium is missing: run scripts/ensure_chromium.sh (make test does)")
    return path


def run_chromium(profile: Path, *args: str) -> str:
    out = subprocess.run(
        [chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=CHROMIUM_TIMEOUT_S,
        check=True,
    )
    return out.stdout


@pytest.fixture(scope="module")
def finished_job(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LiveServer, SeededJob]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('browser') / 'stageprof.db'}"
    upgrade(url)
    engine = make_engine(url)
    factory: sessionmaker[Session] = make_sessionmaker(engine)
    job = seed_job(factory, num_layers=8, num_microbatches=6)
    with LiveServer(Settings(database_url=url)) as srv:
        yield srv, job
    engine.dispose()


def test_job_page_draws_plan_heatmap_and_gantt(
    finished_job: tuple[LiveServer, SeededJob], tmp_path: Path
) -> None:
    srv, job = finished_job
    assert job.plan is not None
    page = f"{srv.url}/jobs/{job.job_id}"
    dom = run_chromium(tmp_path / "dom", "--dump-dom", page)

    plan_table = re.search(r'<table[^>]*id="plan-stages".*?</table>', dom, re.S)
    assert plan_table is not None
    assert plan_table.group(0).count("<tr>") == 1 + len(job.plan.stages)
    runner_up = re.search(r'<table[^>]*id="runner-up-stages".*?</table>', dom, re.S)
    assert runner_up is not None and job.plan.runner_up is not None
    assert runner_up.group(0).count("<tr") == 1 + len(job.plan.runner_up.stages)
    assert "Plan is stable: runner-up" in dom
    assert 'id="heatmap-svg"' in dom
    # 8 layers: 36 (start, end) cells in the selected submesh/config, one of them failed.
    assert len(re.findall(r'class="heat-cell (?:ok|failed|pending|pruned)"', dom)) == 36
    assert len(re.findall(r'class="heat-cell failed"', dom)) == 1
    assert len(re.findall(r'class="plan-cell"', dom)) == len(job.plan.stages)
    assert dom.count("<option") >= 3 + 3  # the heatmap selector lists every submesh/config
    assert 'id="gantt-svg"' in dom
    bars = re.findall(r'class="gantt-bar (fwd|bwd)"', dom)
    assert len(bars) == len(job.plan.schedule) == 2 * 2 * 6
    assert bars.count("fwd") == bars.count("bwd")
    rows = re.search(r'<table[^>]*id="profile-table".*?</table>', dom, re.S)
    assert rows is not None and rows.group(0).count("<tr>") == 1 + 50  # first page of 50

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "job_page.png"
    shot.unlink(missing_ok=True)
    run_chromium(tmp_path / "shot", f"--screenshot={shot}", "--window-size=1400,1800", page)
    assert shot.stat().st_size > 20_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_running_job_and_jobs_list_without_script_errors(
    finished_job: tuple[LiveServer, SeededJob], tmp_path: Path
) -> None:
    srv, done = finished_job
    factory = make_sessionmaker(make_engine(srv.settings.database_url))
    running = seed_job(
        factory, num_layers=4, finished=False, recorded_fraction=0.5, salt="r", pruned=3
    )
    for path, checks in (
        (
            f"/jobs/{running.job_id}",
            ['class="heat-cell pending"', 'class="heat-cell ok"', "3 pruned"],
        ),
        ("/", [f'data-job-id="{running.job_id}"', f'data-job-id="{done.job_id}"']),
        (f"/models/{done.model_id}", ['id="layers-table"']),
    ):
        out = subprocess.run(
            [chromium(), *FLAGS, f"--user-data-dir={tmp_path / path.replace('/', '_')}"]
            + ["--enable-logging=stderr", "--v=0", "--dump-dom", srv.url + path],
            capture_output=True,
            text=True,
            timeout=CHROMIUM_TIMEOUT_S,
            check=True,
        )
        for needle in checks:
            assert needle in out.stdout, (path, needle)
        console = [line for line in out.stderr.splitlines() if "CONSOLE" in line]
        assert not [line for line in console if "Uncaught" in line or "Error" in line], console
        assert "No jobs yet" not in out.stdout


def test_an_estimate_search_in_chromium(
    finished_job: tuple[LiveServer, SeededJob], tmp_path: Path
) -> None:
    srv, _ = finished_job
    factory = make_sessionmaker(make_engine(srv.settings.database_url))
    job = seed_job(factory, num_layers=6, estimated=True, salt="est")
    running = seed_job(
        factory, num_layers=4, finished=False, recorded_fraction=0.5, salt="ph", phase="estimates"
    )
    assert job.plan is not None
    for path, name in ((f"/jobs/{job.job_id}", "est"), (f"/jobs/{running.job_id}", "ph")):
        out = subprocess.run(
            [chromium(), *FLAGS, f"--user-data-dir={tmp_path / name}"]
            + ["--enable-logging=stderr", "--v=0", "--dump-dom", srv.url + path],
            capture_output=True,
            text=True,
            timeout=CHROMIUM_TIMEOUT_S,
            check=True,
        )
        console = [line for line in out.stderr.splitlines() if "CONSOLE" in line]
        assert not [line for line in console if "Uncaught" in line or "Error" in line], console
        dom = out.stdout
        if name == "ph":  # still said after the page polled the job
            assert '<span class="badge phase" id="job-phase">estimates</span>' in dom
            continue
        # The heatmap of the plan's submesh/config: the stages never measured, in their colour.
        shown = [k for k in estimated_keys(6, make_plan(6, 4, "est")) if k[2:] == (0, 0)]
        assert len(re.findall(r'class="heat-cell estimated"', dom)) == len(shown) > 0
        assert re.search(r'class="tick legend-key">estimated<', dom)
        plan_table = re.search(r'<table[^>]*id="plan-stages".*?</table>', dom, re.S)
        assert plan_table is not None and plan_table.group(0).count("badge measured") == 2
        # The profile table's estimate column: every candidate of this job has one.
        estimates = re.findall(r'<td class="num estimate">([^<]*)</td>', dom)
        assert len(estimates) == 50 and all(e.endswith("ms") for e in estimates), estimates
        assert 'id="plan-search"' in dom
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "job_page_estimates.png"
    shot.unlink(missing_ok=True)
    page = f"{srv.url}/jobs/{job.job_id}"
    run_chromium(tmp_path / "shot", f"--screenshot={shot}", "--window-size=1400,2400", page)
    assert shot.stat().st_size > 20_000
