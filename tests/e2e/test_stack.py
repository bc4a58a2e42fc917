"""End to end: the compose topology as local processes, driven over HTTP.

`stageprof db upgrade` on Postgres (compose's migrate), `stageprof serve --workers 2 --no-migrate`
(api), `stageprof worker` on a local Ray (worker); the SDK posts a zoo GPT, polls the job to
done, reads the plan and the profile table, and posts it again: every profile is reused.
"""

import csv
import io
import secrets
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url

from client.sdk import AuthError, StageprofClient
from schemas import ClusterSpec, Job, JobStatus, PlannedStage
from tests.e2e.stack import LocalStack
from tests.support.databases import postgres_url, reset_postgres
from tests.support.models import FAST_OPTIONS, TINY_GPT
from tests.support.processes import free_port, settings_free_env
from tests.support.waiting import wait_until
from tests.support.xla_flags import with_fast_compile

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.ray, pytest.mark.timeout(900)]

JOB_TIMEOUT_S = 480.0
ZOO_GPT = {"num_layers": 2, **TINY_GPT}
NUM_LAYERS = ZOO_GPT["num_layers"] + 2  # embedding, blocks, LM head
CLUSTER = ClusterSpec(num_hosts=1, devices_per_host=4)
OPTIONS = FAST_OPTIONS.model_copy(update={"num_microbatches": 2, "candidate_timeout_s": 180})


def e2e_database_url() -> str:
    """The test database's `<name>_e2e` sibling on the same server (this run's own), created
    when missing, emptied."""
    base = make_url(postgres_url())
    e2e_database = f"{base.database}_e2e"
    url = base.set(database=e2e_database)
    admin = url.set(drivername="postgresql", database="postgres")
    conninfo = admin.render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (e2e_database,)
        ).fetchone()
        if exists is None:
            conn.execute(f'CREATE DATABASE "{e2e_database}"')
    text = url.render_as_string(hide_password=False)
    reset_postgres(text)
    return text


def stack_env(database_url: str) -> dict[str, str]:
    """This process's environment without stageprof/Ray settings, pointed at the e2e DB."""
    env = settings_free_env(also=("RAY_ADDRESS", "XLA_FLAGS"))
    env["XLA_FLAGS"] = with_fast_compile("")  # device counts are the stack's own
    env["STAGEPROF_DATABASE_URL"] = database_url
    return env


def wait_done(api: StageprofClient, stack: LocalStack, job_id: str) -> Job:
    """Poll the job until it finishes, failing at once when a service dies."""

    def finished() -> Job | None:
        job = api.get_job(job_id)
        return job if job.status.finished else None

    return wait_until(
        finished, JOB_TIMEOUT_S, f"job {job_id} done", interval_s=1.0, check=stack.assert_running
    )


def test_compose_topology_plans_a_zoo_model_and_reuses_every_profile(tmp_path: Path) -> None:
    database_url = e2e_database_url()
    env = stack_env(database_url)
    token = secrets.token_urlsafe(24)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with LocalStack(tmp_path, env) as stack:
        # migrate, then api (it must not migrate itself), then worker: the compose order
        out = stack.run("migrate", "db", "upgrade")
        assert "is at head" in out
        stack.start(
            "api",
            *("serve", "--host", "127.0.0.1", "--port", str(port), "--workers", "2"),
            *("--no-migrate", "--log-level", "warning"),
            env=env | {"STAGEPROF_API_TOKEN": token},
        )
        stack.start(
            "worker",
            *("worker", "--workers", "2", "--devices-per-worker", "4", "--idle-sleep", "0.5"),
        )
        assert stack.wait_healthy(base) == {"status": "ok", "database": "ok"}

        with StageprofClient(base, token="") as anonymous:
            with pytest.raises(AuthError) as refused:
                anonymous.submit_plan(zoo="gpt", zoo_config=ZOO_GPT, cluster=CLUSTER)
            assert refused.value.status_code == 401
            assert anonymous.list_jobs() == []  # reads are open; nothing was queued

        with StageprofClient(base, token=token) as api:
            first = _plan_and_check(api, stack, base)
            assert first.progress.measured > 0 and first.progress.reused == 0

            second_ref = api.submit_plan(
                zoo="gpt", zoo_config=ZOO_GPT, cluster=CLUSTER, options=OPTIONS
            )
            second = wait_done(api, stack, second_ref.job_id)
            assert second.status == JobStatus.done, second.error
            p1, p2 = first.progress, second.progress
            assert p2.measured == 0, p2
            assert (p2.candidates, p2.distinct_stages, p2.pruned, p2.estimated) == (
                p1.candidates,
                p1.distinct_stages,
                p1.pruned,
                p1.estimated,
            )
            rows = list(api.iter_profiles(job_id=second.id, sort="start"))
            recorded = [r for r in rows if r["profile_id"] is not None]
            assert recorded and all(r["reused"] for r in recorded)
            stages = {r["fingerprint"] for r in recorded}
            assert p2.reused == len(stages) == p2.done - p2.pruned - p2.failed - p2.estimated
            assert p2.pruned == len({r["fingerprint"] for r in rows if r["status"] == "pruned"})
            assert second.model_id == first.model_id  # the same spec, stored once
            # the same stages; what the first job estimated before it measured one is its
            # own search's (the second reused every stage and estimated none)
            assert _as_measured(api.get_plan(second.id).stages) == _as_measured(
                api.get_plan(first.id).stages
            )


def _as_measured(stages: list[PlannedStage]) -> list[PlannedStage]:
    return [s.model_copy(update={"estimated_cost_s": None}) for s in stages]


def _plan_and_check(api: StageprofClient, stack: LocalStack, base: str) -> Job:
    """Post the zoo GPT, poll it to done, read its plan, profile table and dashboard page."""
    ref = api.submit_plan(zoo="gpt", zoo_config=ZOO_GPT, cluster=CLUSTER, options=OPTIONS)
    assert ref.status == JobStatus.queued and ref.url == f"/v1/jobs/{ref.job_id}"
    job = wait_done(api, stack, ref.job_id)
    assert job.status == JobStatus.done, job.error
    assert job.model_id is not None and job.zoo is not None and job.zoo.name == "gpt"
    p = job.progress
    assert (
        p.distinct_stages == p.done == p.measured + p.reused + p.failed + p.pruned + p.estimated > 0
    )

    plan = api.get_plan(job.id)
    covered = [i for st in plan.stages for i in range(st.start, st.end + 1)]
    assert covered == list(range(NUM_LAYERS)) and plan.num_layers == NUM_LAYERS
    # interleaved: p·v chunks on p device groups, each group holding v chunks
    assert sum(st.submesh.num_devices for st in plan.stages) == (
        CLUSTER.num_devices * plan.virtual_stages
    )
    assert plan.num_microbatches == OPTIONS.num_microbatches
    assert plan.predicted_iteration_time_s > 0 and plan.baselines

    rows = list(api.iter_profiles(job_id=job.id, sort="start"))
    assert len(rows) == job.progress.candidates
    assert {r["job_id"] for r in rows} == {job.id}
    assert all(r["status"] is not None for r in rows)  # every candidate has an outcome
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and all(r["compute_cost"] > 0 and r["peak_memory"] > 0 for r in ok)
    measured = {r["fingerprint"] for r in rows if r["profile_id"] is not None and not r["reused"]}
    assert len(measured) == job.progress.measured
    planned = {st.fingerprint for st in plan.stages}
    assert planned <= {r["fingerprint"] for r in ok}

    table = list(csv.DictReader(io.StringIO(api.profiles_csv(job_id=job.id, sort="start"))))
    assert len(table) == len(rows)
    assert [(int(r["start"]), int(r["end"])) for r in table] == [
        (r["start"], r["end"]) for r in rows
    ]

    page = httpx.get(f"{base}{ref.dashboard_url}", timeout=30.0)  # reads are open
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert job.id in page.text
    return job
