"""The client SDK against the live server: schemas in, schemas out, errors as exceptions."""

import subprocess
import sys
import threading
import time

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from client.sdk import (
    AuthError,
    ConflictError,
    InvalidRequest,
    JobTimeout,
    NotFoundError,
    ServerUnreachable,
    StageprofClient,
    StageprofError,
)
from schemas import ClusterSpec, JobStatus, PlanOptions
from store import finish_job, session_scope
from tests.server.factories import exported_chain_spec, make_plan, seed_job
from tests.server.live import LiveServer
from tests.support.processes import free_port


@pytest.fixture
def sdk(api: httpx.Client, live_server: LiveServer) -> StageprofClient:
    with StageprofClient(live_server.url, token="") as client:
        yield client


def test_models_and_plans(sdk: StageprofClient) -> None:
    spec = exported_chain_spec(num_layers=3)
    ref = sdk.put_model(spec)
    assert ref.created and ref.layer_fingerprints == [layer.fingerprint for layer in spec.layers]
    assert sdk.put_model(spec).id == ref.id
    stored = sdk.get_model(ref.id, programs=True)
    assert stored.layers[0].forward == spec.layers[0].forward
    assert stored.layers[0].backward == spec.layers[0].backward
    job = sdk.submit_plan(
        model_id=ref.id,
        cluster=ClusterSpec(num_hosts=1, devices_per_host=2),
        options=PlanOptions(num_microbatches=2),
    )
    assert job.status == JobStatus.queued and job.model_id == ref.id
    zoo_job = sdk.submit_plan(zoo="gpt", zoo_config={"num_layers": 2})
    got = sdk.get_job(zoo_job.job_id)
    assert got.zoo is not None and got.zoo.config == {"num_layers": 2}
    assert {j.id for j in sdk.list_jobs()} == {job.job_id, zoo_job.job_id}
    assert [j.id for j in sdk.list_jobs(status=JobStatus.done)] == []
    assert sdk.cancel_job(zoo_job.job_id).status == JobStatus.cancelled
    with pytest.raises(ConflictError):
        sdk.cancel_job(zoo_job.job_id)
    with pytest.raises(ConflictError):
        sdk.get_plan(job.job_id)


def test_errors_carry_status_and_detail(sdk: StageprofClient) -> None:
    with pytest.raises(NotFoundError) as e:
        sdk.get_job("nope")
    assert e.value.status_code == 404 and "nope" in e.value.detail
    with pytest.raises(InvalidRequest) as e2:
        sdk.submit_plan(zoo="gpt", zoo_config={"layers": 3})
    assert e2.value.status_code == 422 and e2.value.detail[0]["field"] == "zoo.config.layers"


def test_wait_for_job_and_plan(sdk: StageprofClient, db: sessionmaker[Session]) -> None:
    seeded = seed_job(db, num_layers=4, finished=False)

    def finish() -> None:
        time.sleep(0.5)
        with session_scope(db) as s:
            plan = make_plan(4, 4, "fp")
            finish_job(s, job_id=seeded.job_id, owner=None, status=JobStatus.done, plan=plan)

    t = threading.Thread(target=finish)
    t.start()
    with pytest.raises(TimeoutError):
        sdk.wait_for_job(seeded.job_id, timeout_s=0.1, poll_s=0.05)
    job = sdk.wait_for_job(seeded.job_id, timeout_s=30, poll_s=0.1)
    t.join()
    assert job.status == JobStatus.done
    assert sdk.get_plan(seeded.job_id).num_layers == 4
    matrix = sdk.cost_matrix(seeded.job_id)
    assert matrix["num_layers"] == 4 and len(matrix["matrices"]) == 3


def test_profiles(sdk: StageprofClient, db: sessionmaker[Session]) -> None:
    seeded = seed_job(db, num_layers=4)
    page = sdk.list_profiles(job_id=seeded.job_id, limit=5, sort="-compute_cost")
    assert len(page.items) == 5 and page.next_cursor
    assert page.items[0]["compute_cost"] >= page.items[-1]["compute_cost"]
    rows = list(sdk.iter_profiles(job_id=seeded.job_id))
    assert len(rows) == seeded.num_candidates
    failed = sdk.list_profiles(job_id=seeded.job_id, status=["oom", "compile_error"])
    assert {r["status"] for r in failed.items} == {"oom", "compile_error"}
    text = sdk.profiles_csv(job_id=seeded.job_id, limit=3)
    assert text.splitlines()[0].startswith("id,job_id") and len(text.splitlines()) == 4
    full = sdk.get_profile(rows[0]["fingerprint"])
    assert full.fingerprint == rows[0]["fingerprint"]
    assert sdk.health() == {"status": "ok", "database": "ok"}


def test_token_from_the_environment(
    db_url: str, db: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from server import Settings

    token = "sdk-test-token-0123456789abcdef"
    with LiveServer(Settings(database_url=db_url, api_token=token)) as srv:
        monkeypatch.delenv("STAGEPROF_API_TOKEN", raising=False)
        with StageprofClient(srv.url) as anonymous, pytest.raises(AuthError):
            anonymous.put_model(exported_chain_spec(num_layers=2))
        monkeypatch.setenv("STAGEPROF_API_TOKEN", token)
        with StageprofClient(srv.url) as client:
            assert client.put_model(exported_chain_spec(num_layers=2)).created


def test_wait_for_job_waits_until_the_end_by_default_and_reports_progress(
    sdk: StageprofClient, db: sessionmaker[Session]
) -> None:
    seeded = seed_job(db, num_layers=4, finished=False)

    def finish() -> None:
        time.sleep(2.5)  # longer than several polls: no default timeout may fire
        with session_scope(db) as s:
            plan = make_plan(4, 4, "fp")
            finish_job(s, job_id=seeded.job_id, owner=None, status=JobStatus.done, plan=plan)

    seen: list[JobStatus] = []
    t = threading.Thread(target=finish)
    t.start()
    job = sdk.wait_for_job(seeded.job_id, poll_s=0.2, on_progress=lambda j: seen.append(j.status))
    t.join()
    assert job.status == JobStatus.done
    assert seen[-1] == JobStatus.done and len(seen) >= 2 and seen[0] != JobStatus.done
    with pytest.raises(JobTimeout, match="still"):
        sdk.wait_for_job(seed_job(db, num_layers=2, finished=False).job_id, timeout_s=0.2)


def test_errors_are_one_readable_family(sdk: StageprofClient, live_server: LiveServer) -> None:
    with pytest.raises(InvalidRequest) as bad:
        sdk.submit_plan(zoo="gpt", zoo_config={"layers": 3})
    text = str(bad.value)
    assert isinstance(bad.value, StageprofError)
    assert f"POST {live_server.url}/v1/plans" in text and "422" in text
    assert "zoo.config.layers:" in text and "\n" not in text
    port = free_port()
    with StageprofClient(f"http://127.0.0.1:{port}") as nobody:
        with pytest.raises(ServerUnreachable) as down:
            nobody.health()
    assert f"127.0.0.1:{port}" in str(down.value) and "refused" in str(down.value)


def test_cli_prints_one_line_when_the_server_is_down() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    out = subprocess.run(
        [sys.executable, "-m", "cli", "plan", "--server", url, "--zoo", "mlp"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    errors = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    assert url in errors[0] and "cannot reach" in errors[0]
