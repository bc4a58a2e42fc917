"""A job that searches the count of micro-batches, through the API: POSTed for a zoo model
(the runner traces it with a symbolic batch dimension), run by a runner on the server's
database, and its plan's JSON names the chosen count and every count's best."""

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from client import zoo
from client.symbolic_batch import build_zoo_symbolic
from schemas import JobStatus, Plan
from tests.runner.conftest import ray_cluster  # noqa: F401 (a fixture)
from tests.support.models import TINY_GPT
from workers.jobs.runner import JobRunner, RunnerConfig

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

OPTIONS = {
    "schedule": "1f1b",
    "remat": "as_written",
    "config_space": "data_parallel_only",
    "strategies": ["data"],
    "repeats": 2,
    "warmup": 1,
    "num_microbatches": 2,
    "microbatch_search": [2, 4],
}


def test_a_posted_microbatch_search_runs_to_a_plan_of_the_fastest_count(
    api: httpx.Client, db: sessionmaker[Session]
) -> None:
    config = {"num_layers": 1} | TINY_GPT
    body = {
        "zoo": "gpt",
        "config": config,
        "cluster": {"num_hosts": 1, "devices_per_host": 2},
        "options": OPTIONS,
    }
    r = api.post("/v1/plans", json=body)
    assert r.status_code == 202, r.text
    created = r.json()
    job_id = created["job_id"]
    runner = JobRunner(
        db,
        RunnerConfig(num_workers=2, lease_seconds=20),
        build_zoo=lambda name, cfg: zoo.build(name, **cfg),
        build_zoo_symbolic=lambda name, cfg: build_zoo_symbolic(name, **cfg),
    )
    outcome = runner.run_next(job_id)
    assert outcome is not None and outcome.status == JobStatus.done, outcome and outcome.error
    r = api.get(f"/v1/jobs/{job_id}/plan")
    assert r.status_code == 200, r.text
    plan = Plan.model_validate(r.json())
    options = {o.num_microbatches: o for o in plan.microbatch_options}
    assert sorted(options) == [2, 4]
    assert [o.micro_batch_size for o in options.values()] == [4, 2]
    assert options[plan.num_microbatches].chosen
    assert plan.micro_batch_size == 8 // plan.num_microbatches
    feasible = [o.predicted_iteration_time_s for o in options.values() if o.feasible]
    assert plan.predicted_iteration_time_s == min(t for t in feasible if t is not None)
    job = api.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "done" and job["progress"]["candidates"] > 0
    page = api.get(created["dashboard_url"])  # the job's page shows every count
    assert page.status_code == 200 and 'id="microbatch-options"' in page.text
    assert page.text.count('<span class="badge">chosen</span>') == 1
    # the cost matrices and the profile table keep each size's candidates apart
    matrices = api.get(f"/v1/jobs/{job_id}/cost-matrix").json()
    assert matrices["micro_batch_sizes"] == [2, 4]
    assert matrices["micro_batch_size"] == plan.micro_batch_size
    other = 6 - plan.micro_batch_size
    at_other = api.get(f"/v1/jobs/{job_id}/cost-matrix", params={"micro_batch_size": other})
    assert at_other.status_code == 200 and at_other.json()["micro_batch_size"] == other
    bad = api.get(f"/v1/jobs/{job_id}/cost-matrix", params={"micro_batch_size": 3})
    assert bad.status_code == 422 and "micro_batch_size" in bad.text
    assert "it searched [2, 4]" in bad.text
    rows = api.get("/v1/profiles", params={"job_id": job_id, "limit": 1000}).json()["items"]
    assert {r["micro_batch_size"] for r in rows} == {2, 4}
    for size in (2, 4):
        only = api.get(
            "/v1/profiles", params={"job_id": job_id, "micro_batch_size": size, "limit": 1000}
        ).json()["items"]
        assert only and {r["micro_batch_size"] for r in only} == {size}
        keys = [(r["start"], r["end"], r["submesh_id"], r["config_id"]) for r in only]
        assert len(keys) == len(set(keys))  # one row per stage key at a size
