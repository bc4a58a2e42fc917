"""Progress without a terminal: plain lines, one at least every interval, with the counts
and, for an estimate search, its phase and the stages it estimated."""

import io
import time
from datetime import UTC, datetime
from types import SimpleNamespace

from cli.commands.plan_output import stats_of
from cli.commands.progress_output import job_snapshot, plain_progress, progress_line
from schemas import ClusterSpec, Job, JobStatus, PlanOptions, Progress


def _job(status: str, total: int, done: int, **counts: int) -> SimpleNamespace:
    base = {"measured": 0, "reused": 0, "pruned": 0, "failed": 0, "candidates": 2 * total}
    return SimpleNamespace(status=status, distinct_stages=total, done=done, **(base | counts))


def test_progress_line_has_phase_counts_elapsed_and_eta() -> None:
    line = progress_line(_job("profiling", 40, 10, measured=6, reused=2, pruned=1, failed=1), 20)
    assert line.startswith("profiling: 10/40 stages done") and "80 candidates" in line
    assert "measured 6" in line and "reused 2" in line and "pruned 1" in line
    assert "failed 1" in line and "20s elapsed" in line and "ETA 60s" in line
    assert "ETA" not in progress_line(_job("planning", 40, 40), 5)
    assert progress_line(None, 3).startswith("starting")


def test_plain_progress_prints_on_phase_change_and_on_a_timer() -> None:
    stream = io.StringIO()
    with plain_progress(stream, interval_s=0.2) as update:
        update(_job("profiling", 4, 1), None)
        update(_job("profiling", 4, 2), None)  # same phase: no line of its own
        time.sleep(0.5)  # the timer prints while nothing else happens
        update(_job("planning", 4, 4), None)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("starting")
    assert lines[1].startswith("profiling: 1/4")
    timed = [ln for ln in lines if ln.startswith("profiling: 2/4")]
    assert len(timed) >= 2
    assert lines[-1].startswith("planning: 4/4")
    assert [ln for ln in lines if ln.startswith("planning")] == lines[-1:]  # printed once
    assert "\x1b[" not in stream.getvalue()


def test_a_queued_job_says_it_waits_for_a_worker() -> None:
    line = progress_line(_job("queued", 0, 0), 4)
    assert line.startswith("queued: waiting for a worker") and "4s elapsed" in line


def test_plain_progress_ends_with_the_last_counts_once() -> None:
    stream = io.StringIO()
    with plain_progress(stream, interval_s=60) as update:
        update(_job("profiling", 4, 1), None)
        update(_job("profiling", 4, 3), None)  # same phase: printed at the end
    lines = stream.getvalue().splitlines()
    assert [ln.split(" stages")[0] for ln in lines[1:]] == ["profiling: 1/4", "profiling: 3/4"]
    stream = io.StringIO()
    with plain_progress(stream, interval_s=60) as update:
        update(_job("planning", 4, 4), None)
        update(_job("done", 4, 4), None)  # the final counts, as stored
    lines = stream.getvalue().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["starting", "planning", "done"]


def test_a_job_waiting_for_devices_says_so_at_once() -> None:
    waiting = "waiting for devices held by another job (1 x 4)"
    stream = io.StringIO()
    with plain_progress(stream, interval_s=60) as update:
        update(_job("profiling", 4, 1), None)
        update(SimpleNamespace(**vars(_job("profiling", 4, 1)), waiting=waiting), None)
        update(SimpleNamespace(**vars(_job("profiling", 4, 1)), waiting=None), None)
    lines = stream.getvalue().splitlines()
    assert lines[1].startswith("profiling: 1/4") and waiting not in lines[1]
    assert lines[2].endswith(f"; {waiting}")  # a line of its own, without the timer
    assert waiting not in lines[3]


def test_an_estimate_search_shows_its_phase_and_estimated_count() -> None:
    job = SimpleNamespace(**vars(_job("profiling", 40, 30, measured=8, estimated=20)))
    job.phase = "verification round 2"
    line = progress_line(job, 20)
    assert line.startswith("profiling (verification round 2): 30/40 stages done"), line
    assert "estimated 20" in line and "measured 8" in line
    assert "ETA" not in line  # most stages are estimated at once at the end: no honest ETA
    job.status, job.phase = "done", None
    assert progress_line(job, 25).startswith("done: 30/40")
    assert "estimated" not in progress_line(_job("profiling", 4, 1), 1)  # none: not said


def test_plain_progress_prints_each_phase_of_the_search() -> None:
    stream = io.StringIO()
    with plain_progress(stream, interval_s=60) as update:
        for phase in ("layer profiles", "layer profiles", "estimates", "verification round 1"):
            update(SimpleNamespace(**vars(_job("profiling", 4, 1)), phase=phase), None)
    lines = stream.getvalue().splitlines()
    phases = [ln.split(":")[0] for ln in lines[1:]]
    assert phases == [
        "profiling (layer profiles)",
        "profiling (estimates)",
        "profiling (verification round 1)",
    ]


def test_an_api_job_s_phase_and_estimates_reach_the_progress_line() -> None:
    job = Job(
        id="j1",
        status=JobStatus.profiling,
        cluster=ClusterSpec(),
        options=PlanOptions(),
        progress=Progress(candidates=12, distinct_stages=10, measured=3, estimated=5),
        phase="estimates",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    snapshot = job_snapshot(job)
    assert snapshot.estimated == 5 and snapshot.done == 8 and snapshot.phase == "estimates"
    line = progress_line(snapshot, 4)
    assert line.startswith("profiling (estimates): 8/10 stages done") and "estimated 5" in line
    assert stats_of(job.progress, 4.0)["estimated"] == 5
