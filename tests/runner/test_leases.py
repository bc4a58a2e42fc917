"""Leases kept through slow phases, and every phase stopped within seconds by a cancel, a
lost lease or a shutdown; reaping on the idle poll; the candidate cap. No Ray: the slow
phase is a zoo build that takes its time."""

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from schemas import ClusterSpec, JobStatus, ModelSpec
from store import JobRow, claim_job, create_job, get_job, request_cancel, session_scope, utcnow
from store.counters import read_counters
from tests.runner.faults_report import record_fault
from tests.support.jobs import queue_job
from tests.support.models import FAST_OPTIONS, tiny_gpt
from workers.jobs.runner import JobOutcome, JobRunner, RunnerConfig

LEASE_S = 1.5
STOP_WITHIN_S = 5.0


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of a test: frees the slow phases left behind."""
    event = threading.Event()
    yield event
    event.set()


def _zoo_job(sessions: sessionmaker[Session]) -> str:
    with session_scope(sessions) as s:
        return create_job(
            s,
            zoo_name="slow",
            zoo_config={},
            cluster=ClusterSpec(num_hosts=1, devices_per_host=2),
            options=FAST_OPTIONS,
        ).id


def _slow_build(started: threading.Event, release: threading.Event, seconds: float) -> Any:
    def build(name: str, cfg: dict[str, Any]) -> ModelSpec:
        started.set()
        release.wait(seconds)
        raise ValueError("the slow build gave up")

    return build


def _runner(sessions: sessionmaker[Session], build: Any, **kw: Any) -> JobRunner:
    config = RunnerConfig(
        lease_seconds=LEASE_S, heartbeat_seconds=0.3, cancel_check_seconds=0.2, **kw
    )
    return JobRunner(sessions, config, build_zoo=build)


def _in_thread(fn: Callable[[], JobOutcome | None]) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    thread.start()
    return thread, box


def _job(sessions: sessionmaker[Session], job_id: str) -> JobRow:
    with session_scope(sessions) as s:
        row = get_job(s, job_id=job_id)
        assert row is not None
        return row


def test_lease_is_renewed_while_a_slow_phase_runs(
    sessions: sessionmaker[Session], release: threading.Event
) -> None:
    job_id = _zoo_job(sessions)
    started = threading.Event()
    runner = _runner(sessions, _slow_build(started, release, 3 * LEASE_S))
    thread, box = _in_thread(runner.run_next)
    assert started.wait(30)
    first = _job(sessions, job_id).lease_expires_at
    deadline = time.monotonic() + 2.5 * LEASE_S
    while time.monotonic() < deadline:  # well past the first lease: nobody can take it
        with session_scope(sessions) as s:
            assert claim_job(s, owner="intruder", lease_seconds=30) is None
        time.sleep(0.2)
    assert first is not None and _job(sessions, job_id).lease_expires_at > first
    thread.join(30)
    outcome = box[0]
    assert outcome.status == JobStatus.failed and "slow build gave up" in outcome.error


def _stop_a_slow_phase(
    sessions: sessionmaker[Session],
    release: threading.Event,
    stop: Callable[[JobRunner, str], None],
) -> tuple[str, Any, float]:
    """Run a job whose zoo build is slow, `stop(runner, job_id)` once it is in that phase;
    the job, the runner's outcome and the seconds from `stop` to the runner's return."""
    job_id = _zoo_job(sessions)
    started = threading.Event()
    runner = _runner(sessions, _slow_build(started, release, 120))
    thread, box = _in_thread(runner.run_next)
    assert started.wait(30)
    stop(runner, job_id)
    asked = time.monotonic()
    thread.join(30)
    return job_id, box[0], time.monotonic() - asked


def test_cancel_stops_a_slow_phase_within_seconds(
    sessions: sessionmaker[Session], release: threading.Event
) -> None:
    def cancel(runner: JobRunner, job_id: str) -> None:
        with session_scope(sessions) as s:
            request_cancel(s, job_id=job_id)

    job_id, outcome, took = _stop_a_slow_phase(sessions, release, cancel)
    record_fault(
        "cancel during a slow phase",
        f"cancelled within {STOP_WITHIN_S:g} s",
        outcome.status.value,
        took,
    )
    assert took < STOP_WITHIN_S
    assert outcome.status == JobStatus.cancelled
    row = _job(sessions, job_id)
    assert row.status == "cancelled" and row.finished_at is not None


def test_shutdown_hands_the_job_back_within_seconds(
    sessions: sessionmaker[Session], release: threading.Event
) -> None:
    job_id, outcome, took = _stop_a_slow_phase(
        sessions, release, lambda runner, _: runner.shutdown.set()
    )
    record_fault(
        "shutdown (SIGTERM) during a slow phase",
        f"job handed back within {STOP_WITHIN_S:g} s",
        outcome.status.value,
        took,
    )
    assert took < STOP_WITHIN_S
    assert outcome.status == JobStatus.profiling
    with session_scope(sessions) as s:  # handed back: another runner takes it over at once
        again = claim_job(s, owner="next", lease_seconds=30)
        assert again is not None and again.id == job_id and again.attempts == 2


def test_a_runner_that_lost_its_lease_stops_and_leaves_the_job_alone(
    sessions: sessionmaker[Session], release: threading.Event
) -> None:
    def usurp(runner: JobRunner, job_id: str) -> None:
        with session_scope(sessions) as s:  # as if the lease had expired and another took it
            s.execute(update(JobRow).where(JobRow.id == job_id).values(lease_owner="usurper"))

    job_id, outcome, took = _stop_a_slow_phase(sessions, release, usurp)
    record_fault(
        "lease lost during a slow phase",
        f"runner stops within {STOP_WITHIN_S:g} s",
        f"stopped: {outcome.error}",
        took,
    )
    assert took < STOP_WITHIN_S
    assert outcome.status == JobStatus.profiling and "lost" in outcome.error
    row = _job(sessions, job_id)
    assert row.status == "profiling" and row.lease_owner == "usurper"


def test_idle_runner_reaps_cancelled_jobs_whose_runner_is_gone(
    sessions: sessionmaker[Session],
) -> None:
    job_id = _zoo_job(sessions)
    with session_scope(sessions) as s:
        assert claim_job(s, owner="dead", lease_seconds=30) is not None
        request_cancel(s, job_id=job_id)
    runner = _runner(sessions, None)
    assert runner.reap_idle() == []  # its lease still runs: the dead runner might end it
    with session_scope(sessions) as s:
        s.execute(update(JobRow).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    runner.counters.add("db_retries", 2)
    assert runner.reap_idle() == [job_id]
    assert _job(sessions, job_id).status == "cancelled"
    with session_scope(sessions) as s:
        counters = read_counters(s)
    assert counters["jobs_reaped"] == 1 and counters["db_retries"] == 2


def test_candidates_over_the_cap_fail_the_job_before_enumeration(
    sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAGEPROF_MAX_CANDIDATES", "5")
    job_id = queue_job(sessions, tiny_gpt(num_layers=2))
    outcome = JobRunner(sessions, RunnerConfig(num_workers=1)).run_next()
    assert outcome is not None and outcome.job_id == job_id
    assert outcome.status == JobStatus.failed
    assert "over the cap of 5" in (outcome.error or "") and "STAGEPROF_MAX_CANDIDATES" in (
        outcome.error or ""
    )
