"""A job on a 2 hosts x 2 devices cluster, run by the runner on a real two-node Ray: its
2-host stages are measured across both nodes and the stored rows say by which processes;
a process killed mid-candidate costs that candidate (`worker_lost`), not the job."""

import os
import threading
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from schemas import JobStatus, ProfileStatus
from store import job_results, session_scope
from store.tables import StageProfileRow
from tests.multihost.cluster import CLUSTER, OPTIONS
from tests.support.jobs import queue_job
from tests.support.models import tiny_gpt
from tests.support.waiting import wait_until
from workers.cluster.pool import CandidateRetry
from workers.jobs.runner import JobRunner, RunnerConfig

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("two_nodes")]


def _queue(sessions: sessionmaker[Session], num_layers: int) -> str:
    return queue_job(sessions, tiny_gpt(num_layers), OPTIONS, CLUSTER)


def _results(sessions: sessionmaker[Session], job_id: str) -> dict[Any, Any]:
    with session_scope(sessions) as s:
        return dict(job_results(s, job_id=job_id))


def test_two_host_stages_are_measured_across_both_nodes(
    sessions: sessionmaker[Session],
) -> None:
    job_id = _queue(sessions, num_layers=1)
    outcome = JobRunner(sessions, RunnerConfig()).run_next(job_id)
    assert outcome is not None and outcome.status == JobStatus.done, outcome.error
    results = _results(sessions, job_id).values()
    spread = [r for r in results if r.submesh.hosts == 2]
    local = [r for r in results if r.submesh.hosts == 1]
    assert spread and local and all(r.ok for r in results)
    for r in spread:
        assert len(r.measured_by) == 2
        assert len({p.split(":")[0] for p in r.measured_by}) == 2  # two nodes
    assert all(len(r.measured_by) == 1 for r in local)
    with session_scope(sessions) as s:
        stored = list(s.scalars(select(StageProfileRow)))
    assert sorted(len(row.measured_by) for row in stored) == sorted(
        len(r.measured_by) for r in {r.fingerprint: r for r in results}.values()
    )


def test_a_process_killed_mid_candidate_costs_that_candidate_not_the_job(
    sessions: sessionmaker[Session],
) -> None:
    job_id = _queue(sessions, num_layers=1)
    runner = JobRunner(sessions, RunnerConfig(retry=CandidateRetry(max_attempts=1)))
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(runner.run_next(job_id)))
    thread.start()

    def kill_a_busy_rank() -> int | None:
        pool = runner.pool
        busy = [g for g in (pool.groups if pool else []) if g.task and g.shape.processes == 2]
        if not busy:
            return None
        pid = int(busy[0].processes[1].rsplit(":", 1)[1])
        os.kill(pid, 9)
        return pid

    def job_running() -> None:
        assert thread.is_alive(), "the job ended before a 2-host group ran"

    killed = wait_until(
        kill_a_busy_rank, 300, "a busy 2-host group", interval_s=0.05, check=job_running
    )
    thread.join(timeout=600)
    assert killed is not None
    outcome = box[0]
    assert outcome.status == JobStatus.done, outcome.error
    by_stage = {r.fingerprint: r.status for r in _results(sessions, job_id).values()}
    statuses = list(by_stage.values())
    assert statuses.count(ProfileStatus.worker_lost) == 1
    assert statuses.count(ProfileStatus.ok) == len(statuses) - 1
    assert outcome.stats.actors_replaced == 2
