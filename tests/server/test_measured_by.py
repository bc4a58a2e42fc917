"""`measured_by` in every view of the profile table: the JSON API, the CSV, one profile in
full, and the dashboard's table (headless Chromium)."""

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from migrations import upgrade
from schemas import ClusterSpec, PlanOptions, StageKey
from server import Settings
from store import (
    CandidateIn,
    add_candidates,
    create_job,
    make_engine,
    make_sessionmaker,
    put_model,
    record_result,
    refresh_progress,
    save_profile,
    session_scope,
)
from store.queries import PROFILE_COLUMNS
from tests.server.factories import exported_chain_spec, stage_profile
from tests.server.live import LiveServer
from tests.server.test_browser import run_chromium

TWO_HOSTS = ("a1b2c3d4e5f6:4242", "0f9e8d7c6b5a:4250")
ONE = ("local:77",)
# (start, end) on submesh 0, config 0 of a 2-layer chain, and who measured it (None: pending).
MEASURED: dict[tuple[int, int], tuple[str, ...] | None] = {
    (0, 0): TWO_HOSTS,
    (1, 1): ONE,
    (0, 1): None,
}


@dataclass(frozen=True)
class Seeded:
    job_id: str
    fingerprints: dict[tuple[int, int], str]


def seed(factory: sessionmaker[Session], salt: str) -> Seeded:
    """A profiling job of a 2-layer chain: two stages measured (by two processes, by one),
    one pending."""
    fps = {k: f"{salt}-mb-{k[0]}-{k[1]}" for k in MEASURED}
    with session_scope(factory) as s:
        model, _ = put_model(s, spec=exported_chain_spec(2, name=f"mb{salt}"))
        job = create_job(
            s,
            cluster=ClusterSpec(num_hosts=1, devices_per_host=2),
            options=PlanOptions(num_microbatches=2, strategies=["data"]),
            model_id=model.id,
        )
        keys = {k: StageKey(start=k[0], end=k[1], submesh_id=0, config_id=0) for k in MEASURED}
        add_candidates(
            s,
            job_id=job.id,
            model_id=model.id,
            candidates=[CandidateIn(keys[k], fps[k], 1, "data") for k in MEASURED],
        )
        for k, by in MEASURED.items():
            if by is None:
                continue
            result = stage_profile(fps[k], keys[k], (1, 1), (1, 1), "data", 0.01 * (k[0] + 1))
            row = save_profile(s, result=result.model_copy(update={"measured_by": by}))
            record_result(s, job_id=job.id, profile=row, reused=False)
        refresh_progress(s, job_id=job.id)
    return Seeded(job.id, fps)


def by_start_end(rows: list[dict]) -> dict[tuple[int, int], object]:
    return {(r["start"], r["end"]): r["measured_by"] for r in rows}


def test_json_rows_and_full_profile(api: httpx.Client, db: sessionmaker[Session]) -> None:
    job = seed(db, "j")
    page = api.get("/v1/profiles", params={"job_id": job.job_id, "sort": "start"}).json()
    assert by_start_end(page["items"]) == {
        (0, 0): list(TWO_HOSTS),
        (1, 1): list(ONE),
        (0, 1): None,
    }
    full = api.get(f"/v1/profiles/{job.fingerprints[(0, 0)]}").json()
    assert full["measured_by"] == list(TWO_HOSTS)


def test_csv_has_the_column(api: httpx.Client, db: sessionmaker[Session]) -> None:
    job = seed(db, "c")
    r = api.get("/v1/profiles", params={"job_id": job.job_id, "format": "csv", "sort": "start"})
    assert r.status_code == 200, r.text
    header, *rows = list(csv.reader(io.StringIO(r.text)))
    assert header == list(PROFILE_COLUMNS) and "measured_by" in header
    cells = [dict(zip(header, row, strict=True)) for row in rows]
    assert {(int(c["start"]), int(c["end"])): c["measured_by"] for c in cells} == {
        (0, 0): "a1b2c3d4e5f6:4242, 0f9e8d7c6b5a:4250",
        (1, 1): "local:77",
        (0, 1): "",
    }


@pytest.mark.browser
def test_dashboard_profile_table_shows_measured_by(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path_factory.mktemp('browser-mb') / 'stageprof.db'}"
    upgrade(url)
    engine = make_engine(url)
    job = seed(make_sessionmaker(engine), "d")
    with LiveServer(Settings(database_url=url)) as srv:
        dom = run_chromium(tmp_path / "dom", "--dump-dom", f"{srv.url}/jobs/{job.job_id}")
    engine.dispose()
    table = re.search(r'<table[^>]*id="profile-table".*?</table>', dom, re.S)
    assert table is not None
    headers = re.findall(r"<th[^>]*>(.*?)</th>", table.group(0))
    column = headers.index("Measured by")
    body = re.search(r"<tbody>(.*?)</tbody>", table.group(0), re.S)
    assert body is not None
    rows = re.findall(r"<tr>(.*?)</tr>", body.group(1), re.S)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in rows]
    assert all(len(c) == len(headers) for c in cells), cells
    shown = {(int(c[0]), int(c[1])): c[column] for c in cells}
    assert shown == {
        (0, 0): "a1b2c3d4e5f6:4242, 0f9e8d7c6b5a:4250",
        (1, 1): "local:77",
        (0, 1): "–",
    }
