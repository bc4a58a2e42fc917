"""The runner end to end on a local Ray with virtual CPU devices: plan, reuse, faults, cancel."""

import os
import signal
import threading
import time

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from schemas import ClusterSpec, JobStatus, PlanOptions
from store import (
    JobCandidateRow,
    StageProfileRow,
    create_job,
    get_job,
    request_cancel,
    session_scope,
)
from tests.support.jobs import queue_job
from tests.support.models import FAST_OPTIONS, tiny_gpt
from tests.support.waiting import wait_until
from workers.jobs.runner import JobRunner, RunnerConfig

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


def _runner(sessions: sessionmaker[Session], **kw: object) -> JobRunner:
    return JobRunner(sessions, RunnerConfig(num_workers=2, lease_seconds=20, **kw))  # type: ignore[arg-type]


def _recorded_once(sessions: sessionmaker[Session], job_id: str) -> tuple[int, int]:
    """(candidates, candidates with a result or pruned); one profile row per measured stage."""
    with session_scope(sessions) as s:
        total = s.scalar(
            select(func.count())
            .select_from(JobCandidateRow)
            .where(JobCandidateRow.job_id == job_id)
        )
        done = s.scalar(
            select(func.count())
            .select_from(JobCandidateRow)
            .where(JobCandidateRow.job_id == job_id, JobCandidateRow.status.is_not(None))
        )
        fps = s.scalar(
            select(func.count(func.distinct(JobCandidateRow.fingerprint))).where(
                JobCandidateRow.job_id == job_id, JobCandidateRow.profile_id.is_not(None)
            )
        )
        rows = s.scalar(
            select(func.count())
            .select_from(StageProfileRow)
            .where(
                StageProfileRow.fingerprint.in_(
                    select(JobCandidateRow.fingerprint).where(
                        JobCandidateRow.job_id == job_id, JobCandidateRow.profile_id.is_not(None)
                    )
                )
            )
        )
    assert rows == fps
    return int(total or 0), int(done or 0)


def test_job_runs_to_a_plan_and_a_second_job_reuses_everything(
    sessions: sessionmaker[Session],
) -> None:
    spec = tiny_gpt(num_layers=4)  # embed, 4 blocks, head = 6 layers
    job_id = queue_job(sessions, spec)
    runner = _runner(sessions)
    outcome = runner.run_next()
    assert outcome is not None and outcome.job_id == job_id
    assert outcome.status == JobStatus.done, outcome.error
    plan = outcome.plan
    assert plan is not None
    covered = [i for st in plan.stages for i in range(st.start, st.end + 1)]
    assert covered == list(range(spec.num_layers))
    assert sum(st.submesh.num_devices for st in plan.stages) == 4 * plan.virtual_stages
    # the default search: the plan is made of measured stages only, and says what it measured
    assert plan.search is not None and plan.search.mode == "estimate"
    assert all(st.measured for st in plan.stages)
    assert plan.search.layer_profiles > 0
    stats = outcome.stats
    # identical blocks: far fewer distinct stages than candidates
    assert stats.distinct_stages < 0.8 * stats.candidates
    assert stats.measured + stats.pruned + stats.estimated == stats.distinct_stages
    assert stats.reused == 0
    total, done = _recorded_once(sessions, job_id)
    assert total == done == stats.candidates
    with session_scope(sessions) as s:
        row = get_job(s, job_id=job_id)
        assert row is not None and row.status == "done" and row.plan is not None
        assert row.candidates == stats.candidates and row.measured == stats.measured
        assert row.done == row.distinct_stages == stats.distinct_stages

    second = queue_job(sessions, tiny_gpt(num_layers=4))
    again = runner.run_next()
    assert again is not None and again.job_id == second and again.status == JobStatus.done
    assert again.stats.actors_started == 0  # nothing to measure: no actor started
    assert again.stats.measured == 0
    assert again.stats.distinct_stages == stats.distinct_stages
    assert again.stats.reused == stats.measured and again.stats.pruned == stats.pruned
    assert again.stats.estimated == stats.estimated
    assert again.plan is not None

    def layout(stages: list) -> list:  # type: ignore[type-arg]
        """The stages without the first job's estimates (made before it measured them)."""
        return [st.model_dump(exclude={"estimated_cost_s"}) for st in stages]

    assert layout(again.plan.stages) == layout(plan.stages)


def test_killed_actor_is_replaced_and_its_candidate_retried(
    sessions: sessionmaker[Session],
) -> None:
    job_id = queue_job(sessions, tiny_gpt(num_layers=2, hidden_size=48, num_heads=4))
    runner = _runner(sessions)
    outcome_box: list[object] = []
    thread = threading.Thread(target=lambda: outcome_box.append(runner.run_next()))
    thread.start()
    running: list[int] = []

    def measuring_a_stage() -> bool:
        # a process measuring a stage now: killing an idle one may go unnoticed (its group
        # is given back when the search's round ends)
        pool = runner.pool
        running[:] = pool.actor_pids(running=True) if pool is not None else []
        return bool(running)

    wait_until(measuring_a_stage, 120, "the job measuring a stage", interval_s=0.05)
    os.kill(running[0], signal.SIGKILL)
    thread.join(timeout=600)
    outcome = outcome_box[0]
    assert outcome.status == JobStatus.done, outcome.error  # type: ignore[attr-defined]
    assert outcome.stats.actors_replaced >= 1  # type: ignore[attr-defined]
    total, done = _recorded_once(sessions, job_id)
    assert total == done > 0


def _any_recorded(sessions: sessionmaker[Session], job_id: str) -> bool:
    with session_scope(sessions) as s:
        row = get_job(s, job_id=job_id)
        return row is not None and row.done > 0


def test_cancel_stops_a_running_job_within_seconds(sessions: sessionmaker[Session]) -> None:
    job_id = queue_job(sessions, tiny_gpt(num_layers=4, hidden_size=40, num_heads=2))
    runner = JobRunner(sessions, RunnerConfig(num_workers=2, heartbeat_seconds=0.5))
    box: list[object] = []
    thread = threading.Thread(target=lambda: box.append(runner.run_next()))
    thread.start()
    wait_until(lambda: _any_recorded(sessions, job_id), 120, "a recorded candidate")
    with session_scope(sessions) as s:
        request_cancel(s, job_id=job_id)
    asked = time.monotonic()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert time.monotonic() - asked < 15
    assert box[0].status == JobStatus.cancelled  # type: ignore[attr-defined]
    with session_scope(sessions) as s:
        row = get_job(s, job_id=job_id)
        assert row is not None and row.status == "cancelled" and row.finished_at is not None
        assert row.done < row.distinct_stages


def test_every_candidate_timing_out_fails_the_job_saying_why(
    sessions: sessionmaker[Session],
) -> None:
    options = FAST_OPTIONS.model_copy(update={"candidate_timeout_s": 0.3})
    job_id = queue_job(sessions, tiny_gpt(num_layers=1, hidden_size=24, num_heads=2), options)
    # No grace: the pool kills an actor still compiling past the limit; an actor that gets
    # past a phase first reports the timeout itself. Either way the result is `timeout`.
    runner = JobRunner(sessions, RunnerConfig(num_workers=2, kill_grace_s=0.0))
    outcome = runner.run_next()
    assert outcome is not None and outcome.status == JobStatus.failed
    assert outcome.error is not None and "every candidate failed" in outcome.error
    assert "timeout" in outcome.error
    total, done = _recorded_once(sessions, job_id)
    assert total == done


def test_zoo_job_is_built_by_the_runner(sessions: sessionmaker[Session]) -> None:
    from client import zoo

    with session_scope(sessions) as s:
        job = create_job(
            s,
            zoo_name="gpt",
            zoo_config={
                "num_layers": 1,
                "hidden_size": 16,
                "num_heads": 2,
                "seq_len": 8,
                "vocab_size": 64,
                "batch_size": 4,
            },
            cluster=ClusterSpec(num_hosts=1, devices_per_host=2),
            options=FAST_OPTIONS,
        )
        job_id = job.id
    runner = JobRunner(
        sessions,
        RunnerConfig(num_workers=1),
        build_zoo=lambda name, cfg: zoo.build(name, **cfg),
    )
    outcome = runner.run_next()
    assert outcome is not None and outcome.status == JobStatus.done, outcome.error
    with session_scope(sessions) as s:
        row = get_job(s, job_id=job_id)
        assert row is not None and row.model_id is not None


def test_bad_zoo_config_fails_the_job_with_the_reason(sessions: sessionmaker[Session]) -> None:
    from client import zoo

    with session_scope(sessions) as s:
        job_id = create_job(
            s,
            zoo_name="gpt",
            zoo_config={"num_layerz": 2},
            cluster=ClusterSpec(),
            options=PlanOptions(),
        ).id
    runner = JobRunner(sessions, build_zoo=lambda name, cfg: zoo.build(name, **cfg))
    outcome = runner.run_next()
    assert outcome is not None and outcome.job_id == job_id
    assert outcome.status == JobStatus.failed and "num_layerz" in (outcome.error or "")
