"""Concurrent jobs of one model on two runners, on the real Postgres: each stage is measured
once across all of them (stage claims), the others wait for its result."""

import threading
import time

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from schemas import JobStatus
from store import (
    JobCandidateRow,
    StageProfileRow,
    session_scope,
)
from store.counters import read_counters
from store.tables import StageClaimRow
from tests.runner.faults_report import record_fault
from tests.support.jobs import queue_job
from tests.support.models import FAST_OPTIONS, tiny_gpt
from tests.support.waiting import wait_until
from workers.jobs.runner import JobOutcome, JobRunner, RunnerConfig

pytestmark = [
    pytest.mark.ray,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.usefixtures("ray_cluster"),
]

JOBS = 3
RUNNERS = 2
TIMEOUT_S = 600


def test_concurrent_jobs_measure_each_stage_once(pg_sessions: sessionmaker[Session]) -> None:
    spec = tiny_gpt(num_layers=2)
    options = FAST_OPTIONS.model_copy(update={"prune": False})  # every distinct stage measured
    job_ids = {queue_job(pg_sessions, spec, options) for _ in range(JOBS)}
    outcomes: list[JobOutcome] = []
    stop = threading.Event()

    def work(runner: JobRunner) -> None:
        while not stop.is_set():
            outcome = runner.run_next()
            if outcome is None:
                stop.wait(0.2)
            else:
                outcomes.append(outcome)

    runners = [
        JobRunner(pg_sessions, RunnerConfig(num_workers=1, lease_seconds=20))
        for _ in range(RUNNERS)
    ]
    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in runners]
    for t in threads:
        t.start()
    began = time.monotonic()
    try:
        wait_until(lambda: len(outcomes) >= JOBS, TIMEOUT_S, f"all {JOBS} jobs", interval_s=0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    wall = time.monotonic() - began
    assert {o.job_id for o in outcomes} == job_ids
    assert all(o.status == JobStatus.done for o in outcomes), [o.error for o in outcomes]
    with session_scope(pg_sessions) as s:
        distinct = s.scalar(select(func.count(func.distinct(JobCandidateRow.fingerprint))))
        profiles = s.scalar(select(func.count()).select_from(StageProfileRow))
        claims = s.scalar(select(func.count()).select_from(StageClaimRow))
        waited = read_counters(s).get("stage_claims_waited", 0)
    measured = sum(o.stats.measured for o in outcomes)
    # Every distinct stage was measured by exactly one runner; none twice.
    assert measured == profiles == distinct
    assert claims == 0
    assert waited == sum(o.stats.waited for o in outcomes)
    record_fault(
        f"{JOBS} concurrent jobs of one model, {RUNNERS} runners",
        "stages measured = distinct stages",
        f"{measured} measured, {profiles} stored, {distinct} distinct, {waited} waited for",
        wall,
    )
