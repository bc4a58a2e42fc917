"""An estimate search's job over HTTP, on SQLite and Postgres: its phase and estimated count,
the profile table's `estimated` status and `estimated_cost` (JSON and CSV), the cost
matrix's estimates and the plan's search summary."""

import csv
import io

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.server.factories import candidate_cost, estimated_keys, make_plan, seed_job
from tests.support.estimates import ESTIMATE_ERROR, SEARCH

Key = tuple[int, int, int, int]


def _key(row: dict) -> Key:
    return (row["start"], row["end"], row["submesh_id"], row["config_id"])


def _rows(api: httpx.Client, **params: object) -> list[dict]:
    r = api.get("/v1/profiles", params={"limit": 1000, **params})
    assert r.status_code == 200, r.text
    items: list[dict] = r.json()["items"]
    return items


def test_the_profile_table_filters_estimated_stages(
    api: httpx.Client, db: sessionmaker[Session]
) -> None:
    seeded = seed_job(db, num_layers=6, estimated=True)
    other = seed_job(db, num_layers=4, salt="other")  # a job of the previous search
    never = estimated_keys(6, make_plan(6, 4, "fp"))
    rows = _rows(api, job_id=seeded.job_id, status="estimated")
    assert {_key(r) for r in rows} == never and len(rows) == len(never)
    for r in rows:
        assert r["status"] == "estimated" and r["compute_cost"] is None
        assert r["peak_memory"] is None and r["recorded_at"] is not None
        assert r["estimated_cost"] == pytest.approx(candidate_cost(*_key(r)) * (1 + ESTIMATE_ERROR))
    measured = _rows(api, job_id=seeded.job_id, status="ok")
    assert measured and all(r["estimated_cost"] is not None for r in measured)
    both = _rows(api, job_id=seeded.job_id, status=["ok", "estimated"])
    assert len(both) == len(measured) + len(rows)
    assert not _rows(api, job_id=other.job_id, status="estimated")
    assert all(r["estimated_cost"] is None for r in _rows(api, job_id=other.job_id))
    # Sorted by cost, the estimated ones (no measured cost) come last, in pages too.
    ids = [r["id"] for r in _rows(api, job_id=seeded.job_id, status=["ok", "estimated"])]
    paged: list[int] = []
    cursor = None
    while True:
        q = {"job_id": seeded.job_id, "status": ["ok", "estimated"], "limit": 7}
        page = api.get("/v1/profiles", params=q | ({"cursor": cursor} if cursor else {})).json()
        paged += [r["id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert paged == ids and set(ids[-len(never) :]) == {r["id"] for r in rows}


def test_the_csv_has_the_estimated_cost(api: httpx.Client, db: sessionmaker[Session]) -> None:
    seeded = seed_job(db, num_layers=5, estimated=True)
    params = {"job_id": seeded.job_id, "status": "estimated", "format": "csv", "limit": 1000}
    r = api.get("/v1/profiles", params=params)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert rows and "estimated_cost" in rows[0]
    for row in rows:
        assert row["status"] == "estimated" and row["compute_cost"] == ""
        key = (int(row["start"]), int(row["end"]), int(row["submesh_id"]), int(row["config_id"]))
        assert float(row["estimated_cost"]) == pytest.approx(
            candidate_cost(*key) * (1 + ESTIMATE_ERROR)
        )


def test_a_job_says_its_phase_while_it_runs_and_counts_its_estimates(
    api: httpx.Client, db: sessionmaker[Session]
) -> None:
    running = seed_job(db, num_layers=4, finished=False, salt="r", phase="verification round 2")
    job = api.get(f"/v1/jobs/{running.job_id}").json()
    assert job["status"] == "profiling" and job["phase"] == "verification round 2"
    listed = {j["id"]: j for j in api.get("/v1/jobs").json()["items"]}
    assert listed[running.job_id]["phase"] == "verification round 2"
    done = seed_job(db, num_layers=6, estimated=True, salt="d")
    job = api.get(f"/v1/jobs/{done.job_id}").json()
    assert job["phase"] is None  # finished: no phase
    progress = job["progress"]
    assert progress["estimated"] == len(estimated_keys(6, make_plan(6, 4, "d")))
    assert progress["done"] == progress["distinct_stages"]
    assert progress["done"] == sum(
        progress[k] for k in ("measured", "reused", "failed", "pruned", "estimated")
    )


def test_the_cost_matrix_and_the_plan_carry_the_estimates(
    api: httpx.Client, db: sessionmaker[Session]
) -> None:
    seeded = seed_job(db, num_layers=6, estimated=True)
    never = estimated_keys(6, make_plan(6, 4, "fp"))
    body = api.get(f"/v1/jobs/{seeded.job_id}/cost-matrix").json()
    seen = set()
    for m in body["matrices"]:
        for s in range(6):
            for e in range(s, 6):
                key = (s, e, m["submesh_id"], m["config_id"])
                status, cost = m["status"][s][e], m["compute_cost"][s][e]
                estimate = m["estimated_cost"][s][e]
                assert estimate == pytest.approx(candidate_cost(*key) * (1 + ESTIMATE_ERROR))
                if status == "estimated":
                    seen.add(key)
                    assert cost is None
                elif status == "ok":
                    assert estimate == pytest.approx(cost * (1 + ESTIMATE_ERROR))
    assert seen == never
    plan = api.get(f"/v1/jobs/{seeded.job_id}/plan").json()
    assert plan["search"] == SEARCH.model_dump(mode="json")
    assert all(st["measured"] for st in plan["stages"])
    assert [st["measured"] for st in plan["runner_up"]["stages"]] == [True, False]
    (dp,) = [b for b in plan["baselines"] if b["name"] == "data_parallel"]
    assert [st["measured"] for st in dp["stages"]] == [False]
