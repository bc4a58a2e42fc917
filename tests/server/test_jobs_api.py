"""Jobs over HTTP: list, read, cancel, plan, cost matrix; 404s and 409s."""

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from schemas import ClusterSpec, Plan, PlanOptions
from store import create_job, session_scope
from tests.server.factories import candidate_cost, seed_job
from tests.support.databases import RowCounts


def queued_job(db: sessionmaker[Session]) -> str:
    with session_scope(db) as s:
        return create_job(
            s, cluster=ClusterSpec(), options=PlanOptions(), zoo_name="gpt", zoo_config={}
        ).id


def test_list_jobs_newest_first_with_pages(api: httpx.Client, db: sessionmaker[Session]) -> None:
    ids = [queued_job(db) for _ in range(5)]
    page = api.get("/v1/jobs", params={"limit": 2}).json()
    assert [j["id"] for j in page["items"]] == ids[::-1][:2]
    seen = [j["id"] for j in page["items"]]
    while page["next_before"]:
        page = api.get("/v1/jobs", params={"limit": 2, "before": page["next_before"]}).json()
        seen += [j["id"] for j in page["items"]]
    assert seen == ids[::-1]
    assert api.get("/v1/jobs", params={"status": "done"}).json()["items"] == []
    assert len(api.get("/v1/jobs", params={"status": "queued"}).json()["items"]) == 5


@pytest.mark.parametrize(
    "params", [{"limit": 0}, {"limit": 201}, {"status": "sleeping"}, {"limit": "x"}]
)
def test_list_jobs_bad_params(api: httpx.Client, params: dict) -> None:
    r = api.get("/v1/jobs", params=params)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][0] == "query"


def test_read_job_shows_progress_and_timings(api: httpx.Client, db: sessionmaker[Session]) -> None:
    seeded = seed_job(db, num_layers=4, finished=False, recorded_fraction=0.5)
    job = api.get(f"/v1/jobs/{seeded.job_id}").json()
    assert job["status"] == "profiling" and job["lease_owner"] == "test-runner"
    assert job["progress"]["candidates"] == seeded.num_candidates
    assert job["progress"]["done"] == seeded.num_candidates // 2
    assert job["started_at"] is not None and job["finished_at"] is None
    assert job["has_plan"] is False


def test_unknown_job_is_404_everywhere(api: httpx.Client) -> None:
    for method, path in [
        ("GET", "/v1/jobs/nope"),
        ("DELETE", "/v1/jobs/nope"),
        ("GET", "/v1/jobs/nope/plan"),
        ("GET", "/v1/jobs/nope/cost-matrix"),
    ]:
        r = api.request(method, path)
        assert r.status_code == 404, (method, path)
        assert "nope" in r.json()["detail"]


def test_cancel_queued_running_and_finished(
    api: httpx.Client, db: sessionmaker[Session], row_counts: RowCounts
) -> None:
    queued = queued_job(db)
    r = api.post(f"/v1/jobs/{queued}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    running = seed_job(db, num_layers=2, finished=False, salt="run").job_id
    r = api.delete(f"/v1/jobs/{running}")  # the older form still cancels
    assert r.status_code == 200
    assert r.json()["status"] == "profiling" and r.json()["cancel_requested"] is True
    before = row_counts()
    r = api.post(f"/v1/jobs/{queued}/cancel")
    assert r.status_code == 409 and "cancelled" in r.json()["detail"]
    assert api.get(f"/v1/jobs/{queued}").json()["status"] == "cancelled"
    assert row_counts() == before


def test_plan_of_unfinished_job_is_409(api: httpx.Client, db: sessionmaker[Session]) -> None:
    job_id = queued_job(db)
    r = api.get(f"/v1/jobs/{job_id}/plan")
    assert r.status_code == 409 and "queued" in r.json()["detail"]


def test_plan_of_finished_job(api: httpx.Client, db: sessionmaker[Session]) -> None:
    seeded = seed_job(db, num_layers=6, num_microbatches=4)
    r = api.get(f"/v1/jobs/{seeded.job_id}/plan")
    assert r.status_code == 200
    plan = Plan.model_validate(r.json())
    assert plan == seeded.plan
    assert r.json()["stability"] == "stable" and r.json()["runner_up"]["gap"] > 0
    assert len(plan.schedule) == 2 * 2 * 4  # stages x (fwd, bwd) x micro-batches
    job = api.get(f"/v1/jobs/{seeded.job_id}").json()
    assert job["status"] == "done" and job["has_plan"] and job["finished_at"]


def test_cost_matrix(api: httpx.Client, db: sessionmaker[Session]) -> None:
    seeded = seed_job(db, num_layers=4)
    out = api.get(f"/v1/jobs/{seeded.job_id}/cost-matrix").json()
    assert out["num_layers"] == 4
    assert out["layer_names"] == [f"chain_layer{i}" for i in range(4)]
    mats = {(m["submesh_id"], m["config_id"]): m for m in out["matrices"]}
    assert set(mats) == {(0, 0), (1, 0), (1, 1)}
    m = mats[(1, 1)]
    assert m["submesh"] == [1, 2] and m["logical_mesh"] == [1, 2]
    assert m["strategy"] == "megatron" and m["num_devices"] == 2
    assert "1x2" in m["label"] and "megatron" in m["label"]
    assert m["compute_cost"][0][3] == pytest.approx(candidate_cost(0, 3, 1, 1))
    assert m["compute_cost"][3][0] is None and m["status"][3][0] is None  # end < start
    assert m["compute_cost"][1][2] is None and m["status"][1][2] == "compile_error"
    assert mats[(0, 0)]["status"][0][3] == "oom"
    assert mats[(0, 0)]["compute_cost"][2][2] == pytest.approx(candidate_cost(2, 2, 0, 0))


def test_cost_matrix_marks_pending(api: httpx.Client, db: sessionmaker[Session]) -> None:
    seeded = seed_job(db, num_layers=3, finished=False, recorded_fraction=0.0)
    out = api.get(f"/v1/jobs/{seeded.job_id}/cost-matrix").json()
    m = out["matrices"][0]
    assert m["submesh"] is None and m["status"][0][0] == "pending"
    assert m["compute_cost"][0][0] is None


def test_cost_matrix_of_one_submesh_and_config(
    api: httpx.Client, db: sessionmaker[Session]
) -> None:
    seeded = seed_job(db, num_layers=3)
    url = f"/v1/jobs/{seeded.job_id}/cost-matrix"
    only = api.get(url, params={"submesh_id": 1, "config_id": 0}).json()["matrices"]
    assert [(m["submesh_id"], m["config_id"]) for m in only] == [(1, 0)]
    assert len(api.get(url, params={"submesh_id": 1}).json()["matrices"]) == 2
    assert api.get(url, params={"submesh_id": 7}).json()["matrices"] == []
    assert api.get(url, params={"config_id": -1}).status_code == 422
