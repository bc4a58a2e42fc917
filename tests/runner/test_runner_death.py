"""A runner killed mid-job leaves the job to another runner, which measures nothing stored."""

import os
import signal
import subprocess
import sys

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from schemas import JobStatus
from store import JobCandidateRow, StageProfileRow, get_job, session_scope
from tests.support.jobs import queue_job
from tests.support.models import tiny_gpt
from tests.support.processes import stop_processes
from tests.support.waiting import wait_until
from workers.jobs.runner import JobRunner, RunnerConfig

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

LEASE_S = 4.0


def _done(sessions: sessionmaker[Session], job_id: str) -> int:
    with session_scope(sessions) as s:
        row = get_job(s, job_id=job_id)
        return row.done if row is not None else 0


def test_killed_runner_job_is_taken_over_without_remeasuring(
    sessions: sessionmaker[Session], db_file: str
) -> None:
    job_id = queue_job(sessions, tiny_gpt(num_layers=3, hidden_size=56, num_heads=4))
    env = dict(os.environ, STAGEPROF_DATABASE_URL=db_file)
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.main",
            "worker",
            "--once",
            "--workers",
            "2",
            "--lease-seconds",
            str(LEASE_S),
        ],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def running() -> None:
        assert proc.poll() is None, "the runner exited before it was killed"

    try:
        wait_until(
            lambda: _done(sessions, job_id) >= 3, 240, "three measured stages", check=running
        )
    finally:
        stop_processes([proc], sig=signal.SIGKILL, group=True)
    with session_scope(sessions) as s:
        stored_before = set(
            s.scalars(
                select(JobCandidateRow.fingerprint).where(
                    JobCandidateRow.job_id == job_id, JobCandidateRow.profile_id.is_not(None)
                )
            )
        )
        row = get_job(s, job_id=job_id)
        assert row is not None and row.status == "profiling" and row.done < row.distinct_stages

    runner = JobRunner(sessions, RunnerConfig(num_workers=2, lease_seconds=30))
    # the dead runner's lease has to expire first
    outcome = wait_until(runner.run_next, 60, "the job claimed again", interval_s=0.5)
    assert outcome.job_id == job_id and outcome.status == JobStatus.done, outcome.error
    distinct = outcome.stats.distinct_stages
    assert outcome.stats.measured <= distinct - len(stored_before)
    with session_scope(sessions) as s:
        total, done = s.execute(
            select(func.count(), func.count(JobCandidateRow.status)).where(
                JobCandidateRow.job_id == job_id
            )
        ).one()
        rows = s.scalar(select(func.count()).select_from(StageProfileRow))
        row = get_job(s, job_id=job_id)
        assert row is not None and row.attempts == 2
    assert total == done == outcome.stats.candidates
    # one profile row per measured stage: nothing measured twice
    assert rows == distinct - outcome.stats.pruned - outcome.stats.estimated
