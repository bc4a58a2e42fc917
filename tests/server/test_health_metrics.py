"""/healthz checks the database; /metrics counts requests, jobs by status, stored profiles."""

import re

import httpx
from sqlalchemy.orm import Session, sessionmaker

from server import Settings
from tests.server.factories import seed_job
from tests.server.live import LiveServer

DEAD_DB = "postgresql+psycopg://nobody@127.0.0.1:9/nothing?connect_timeout=2"


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.rsplit(" ", 1)[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} {labels} in metrics")


def test_healthz(api: httpx.Client) -> None:
    r = api.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok", "database": "ok"}


def test_database_down_is_503_not_500() -> None:
    with LiveServer(Settings(database_url=DEAD_DB)) as srv, httpx.Client(base_url=srv.url) as c:
        r = c.get("/healthz")
        assert r.status_code == 503 and r.json()["database"] == "unavailable"
        r = c.get("/v1/jobs")
        assert r.status_code == 503 and "database" in r.json()["detail"]


def test_metrics(api: httpx.Client, db: sessionmaker[Session]) -> None:
    seed_job(db, num_layers=3)
    seed_job(db, num_layers=2, finished=False, salt="q")
    api.get("/v1/jobs/does-not-exist")
    api.get("/v1/jobs/does-not-exist")
    api.get("/no/such/page")
    r = api.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    route = "/v1/jobs/{job_id}"
    assert metric(text, "stageprof_http_requests_total", route=route, status="404") >= 2
    assert metric(text, "stageprof_http_requests_total", route="unmatched", status="404") >= 1
    assert "does-not-exist" not in text  # labels are route templates, never raw paths
    assert metric(text, "stageprof_jobs", status="done") == 1
    assert metric(text, "stageprof_jobs", status="profiling") == 1
    assert metric(text, "stageprof_jobs", status="failed") == 0
    # 3 layers: 6 ranges x 3 configs (one oom, one compile error); 2 layers: 3 x 3 (one oom).
    ok = metric(text, "stageprof_profiles_stored", status="ok")
    failed = metric(text, "stageprof_profiles_stored", status="oom") + metric(
        text, "stageprof_profiles_stored", status="compile_error"
    )
    assert ok + failed == 18 + 9 and failed == 3
    assert "stageprof_http_request_duration_seconds_bucket" in text
