"""Who may write and read: bearer token, loopback-only writes, closed reads."""

from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from server import Settings
from server.access import check_access, is_loopback_host_header
from store import create_job, session_scope
from tests.server.factories import exported_chain_spec, seed_job
from tests.server.live import LiveServer
from tests.support.databases import RowCounts

TOKEN = "s3cret-token-for-tests-0123456789"
READ_TOKEN = "read-only-token-for-tests-987654"


@pytest.fixture(scope="module")
def guarded(db_url: str) -> Iterator[LiveServer]:
    """Writes need TOKEN; reads need TOKEN or READ_TOKEN."""
    settings = Settings(
        database_url=db_url, api_token=TOKEN, read_token=READ_TOKEN, reads_open=False
    )
    with LiveServer(settings) as srv:
        yield srv


@pytest.fixture(scope="module")
def token_only(db_url: str) -> Iterator[LiveServer]:
    """Writes need TOKEN; reads are open."""
    with LiveServer(Settings(database_url=db_url, api_token=TOKEN)) as srv:
        yield srv


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_writes_need_the_token(
    token_only: LiveServer, db: sessionmaker[Session], row_counts: RowCounts
) -> None:
    spec = exported_chain_spec(num_layers=2).model_dump(mode="json")
    before = row_counts()
    with httpx.Client(base_url=token_only.url) as c:
        for headers in (
            {},
            bearer("wrong"),
            {"Authorization": TOKEN},
            {"Authorization": "Basic x"},
        ):
            r = c.post("/v1/models", json=spec, headers=headers)
            assert r.status_code == 401, headers
            assert r.headers["www-authenticate"] == "Bearer"
            assert c.post("/v1/plans", json={"zoo": "gpt"}, headers=headers).status_code == 401
        assert row_counts() == before
        assert c.post("/v1/models", json=spec, headers=bearer(TOKEN)).status_code == 201
        assert c.get("/v1/models").status_code == 200  # reads stay open


def test_cancel_needs_the_token(token_only: LiveServer, db: sessionmaker[Session]) -> None:
    seeded = seed_job(db, num_layers=2, finished=False)
    with httpx.Client(base_url=token_only.url) as c:
        assert c.delete(f"/v1/jobs/{seeded.job_id}").status_code == 401
        assert c.get(f"/v1/jobs/{seeded.job_id}").json()["cancel_requested"] is False
        r = c.delete(f"/v1/jobs/{seeded.job_id}", headers=bearer(TOKEN))
        assert r.status_code == 200 and r.json()["cancel_requested"] is True


def test_closed_reads(guarded: LiveServer, db: sessionmaker[Session]) -> None:
    with session_scope(db) as s:
        from schemas import ClusterSpec, PlanOptions

        job_id = create_job(
            s, cluster=ClusterSpec(), options=PlanOptions(), zoo_name="gpt", zoo_config={}
        ).id
    with httpx.Client(base_url=guarded.url) as c:
        for path in ("/v1/jobs", f"/v1/jobs/{job_id}", "/v1/profiles", "/", "/metrics"):
            assert c.get(path).status_code == 401, path
            assert c.get(path, headers=bearer(READ_TOKEN)).status_code == 200, path
            assert c.get(path, headers=bearer(TOKEN)).status_code == 200, path
        assert c.get("/healthz").status_code == 200
        assert c.get("/static/app.css").status_code == 200
        # The read token does not grant writes.
        r = c.delete(f"/v1/jobs/{job_id}", headers=bearer(READ_TOKEN))
        assert r.status_code == 401
        assert c.get(f"/v1/jobs/{job_id}", headers=bearer(TOKEN)).json()["status"] == "queued"


def test_without_a_token_writes_are_loopback_only(api: httpx.Client, row_counts: RowCounts) -> None:
    spec = exported_chain_spec(num_layers=2).model_dump(mode="json")
    before = row_counts()
    # A remote client behind a local reverse proxy (uvicorn trusts X-Forwarded-For from
    # loopback by default, so the app sees the remote address).
    remote = {"X-Forwarded-For": "203.0.113.7"}
    r = api.post("/v1/models", json=spec, headers=remote)
    assert r.status_code == 403 and "loopback" in r.json()["detail"]
    assert api.get("/v1/jobs", headers=remote).status_code == 200
    # A loopback client that named another host (DNS rebinding) may not write either.
    assert api.post("/v1/models", json=spec, headers={"Host": "evil.example"}).status_code == 403
    assert row_counts() == before
    assert api.post("/v1/models", json=spec, headers={"Host": "localhost:8000"}).status_code == 201


def test_live_loopback_write(api: httpx.Client) -> None:
    spec = exported_chain_spec(num_layers=2).model_dump(mode="json")
    assert api.post("/v1/models", json=spec).status_code == 201


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("localhost", True),
        ("localhost:8000", True),
        ("127.0.0.1:80", True),
        ("[::1]:8000", True),
        ("LOCALHOST", True),
        ("localhost.evil.example", False),
        ("127.0.0.2.nip.io", False),
        ("", False),
        (None, False),
    ],
)
def test_loopback_host_names(host: str | None, ok: bool) -> None:
    assert is_loopback_host_header(host) is ok


def test_check_access_rules() -> None:
    common = {"path": "/v1/models", "host_header": "localhost"}
    open_ = Settings(database_url="sqlite://")
    assert (
        check_access(open_, method="POST", authorization=None, client_host="::1", **common) is None
    )
    refusal = check_access(
        open_, method="POST", authorization=None, client_host="10.0.0.1", **common
    )
    assert refusal is not None and refusal.status_code == 403
    blank = Settings(database_url="sqlite://", api_token="   ")
    assert blank.api_token is None  # a blank token is no token
    closed = Settings(database_url="sqlite://", reads_open=False)
    assert (
        check_access(closed, method="GET", authorization=None, client_host="127.0.0.1", **common)
        is None
    )
    refusal = check_access(
        closed, method="GET", authorization=None, client_host="10.0.0.1", **common
    )
    assert refusal is not None and refusal.status_code == 401
