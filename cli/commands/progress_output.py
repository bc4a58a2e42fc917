"""How `stageprof plan` shows a running job: a rich bar on a terminal, plain lines in logs.

Both say the job's status and, for an estimate search, its phase ("layer profiles",
"estimates", "verification round N") and how many stages it estimated instead of measuring.
"""

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from schemas import Job, JobStatus


class JobCounts(Protocol):
    """What the progress displays read: a `store.JobRow`, or `job_snapshot` of an API job.
    (`waiting`, `phase` and `estimated` are read when present.)"""

    @property
    def status(self) -> object: ...
    @property
    def candidates(self) -> int: ...
    @property
    def distinct_stages(self) -> int: ...
    @property
    def done(self) -> int: ...
    @property
    def measured(self) -> int: ...
    @property
    def reused(self) -> int: ...
    @property
    def pruned(self) -> int: ...
    @property
    def failed(self) -> int: ...


# Called with the job's counts (None: not known yet) and the runner's stats (unused here).
ProgressUpdate = Callable[[JobCounts | None, object], None]


@dataclass(frozen=True)
class JobSnapshot:
    """An API job as the progress displays read it (`JobCounts`)."""

    status: JobStatus
    candidates: int
    distinct_stages: int
    measured: int
    reused: int
    failed: int
    pruned: int
    done: int
    pending: int
    estimated: int = 0
    waiting: str | None = None
    phase: str | None = None


def job_snapshot(job: Job) -> JobSnapshot:
    """A job from the API as the progress displays read it: its status, phase and counts."""
    return JobSnapshot(
        status=job.status, waiting=job.waiting, phase=job.phase, **job.progress.model_dump()
    )


@contextmanager
def progress_bar(console: Console) -> Iterator[ProgressUpdate]:
    """Progress of a job: a rich bar on a terminal, else plain lines (`plain_progress`)."""
    if not console.is_terminal:
        with plain_progress(console.file) as update:
            yield update
        return
    with _rich_progress(console) as update:
        yield update


def status_text(job: JobCounts) -> str:
    """The job's status, with its phase while it runs: "profiling (verification round 2)"."""
    status = getattr(job, "status", None)
    text = str(getattr(status, "value", status) or "profiling")
    phase = job_phase(job)
    return f"{text} ({phase})" if phase else text


def job_phase(job: JobCounts) -> str | None:
    """What a profiling job is doing ("layer profiles", "estimates", "verification round N"),
    or None (not profiling, or a search that says nothing)."""
    status = getattr(job, "status", None)
    if str(getattr(status, "value", status)) != "profiling":
        return None
    phase = getattr(job, "phase", None)
    return str(phase) if phase else None


def progress_line(job: JobCounts | None, elapsed_s: float) -> str:
    """One line of progress from a job row or `Job.progress`-like object (None: starting).
    No ETA while an estimate search runs: most stages are estimated at its end, at once."""
    if job is None:
        return f"starting: workers and the model's stages ({elapsed_s:.0f}s)"
    total, done = job.distinct_stages, job.done
    if str(getattr(job.status, "value", job.status)) == "queued":
        return f"queued: waiting for a worker to take the job, {elapsed_s:.0f}s elapsed"
    eta = ""
    if 0 < done < total and job_phase(job) is None:
        eta = f", ETA {elapsed_s / done * (total - done):.0f}s"
    waiting = getattr(job, "waiting", None)
    estimated = int(getattr(job, "estimated", 0) or 0)
    more = f", estimated {estimated}" if estimated else ""
    return (
        f"{status_text(job)}: {done}/{total} stages done (measured {job.measured}, reused "
        f"{job.reused}, pruned {job.pruned}{more}, failed {job.failed}; {job.candidates} "
        f"candidates), {elapsed_s:.0f}s elapsed{eta}" + (f"; {waiting}" if waiting else "")
    )


@contextmanager
def plain_progress(stream: IO[str], interval_s: float = 10.0) -> Iterator[ProgressUpdate]:
    """Plain progress lines for logs and CI: one line now, one whenever the status or phase
    changes, one at least every `interval_s` seconds while nothing else is printed, and one
    at the end when the counts changed since the last line."""
    started = time.monotonic()
    state: dict[str, Any] = {"job": None, "phase": None, "unprinted": False}
    lock = threading.Lock()
    stop = threading.Event()

    def emit() -> None:
        with lock:
            state["unprinted"] = False
            stream.write(progress_line(state["job"], time.monotonic() - started) + "\n")
            stream.flush()

    def update(job: JobCounts | None, _stats: object) -> None:
        phase = (
            getattr(job, "status", None),
            getattr(job, "waiting", None),
            None if job is None else job_phase(job),
        )
        with lock:
            changed = phase != state["phase"]
            state["job"], state["phase"], state["unprinted"] = job, phase, True
        if changed:
            emit()

    def tick() -> None:
        while not stop.wait(interval_s):
            emit()

    emit()
    thread = threading.Thread(target=tick, name="stageprof-progress", daemon=True)
    thread.start()
    try:
        yield update
    finally:
        stop.set()
        thread.join()
        if state["unprinted"]:
            emit()


@contextmanager
def _rich_progress(console: Console) -> Iterator[ProgressUpdate]:
    """A rich progress bar over stages: done (reused, pruned, estimated, failed) and ETA."""
    progress = Progress(
        TextColumn("[bold]{task.fields[phase]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("stages"),
        TextColumn(
            "reused {task.fields[reused]}  pruned {task.fields[pruned]}  "
            "estimated {task.fields[estimated]}  failed {task.fields[failed]}"
        ),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
    task = progress.add_task(
        "profiling", total=None, phase="starting", reused=0, pruned=0, estimated=0, failed=0
    )

    def update(job: JobCounts | None, _stats: object) -> None:
        if job is None:
            return
        waiting = getattr(job, "waiting", None)
        progress.update(
            task,
            phase=f"{status_text(job)} ({waiting})" if waiting else status_text(job),
            total=job.distinct_stages,
            completed=job.done,
            reused=job.reused,
            pruned=job.pruned,
            estimated=int(getattr(job, "estimated", 0) or 0),
            failed=job.failed,
        )

    with progress:
        yield update
