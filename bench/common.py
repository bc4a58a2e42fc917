"""Shared pieces of the bench/ scripts: fresh stores, the GPT under test, running one job,
percentiles, side-by-side tables and the last-line JSON.

Every script prints a table for people and, as its LAST line, one JSON object with its
figures (`emit_json`). Every job a bench runs (`run_job`) is cold unless it asks otherwise:
its actors get an empty persistent compilation cache of their own (`compile_cache`), never
the user's, so runs compare with each other and with earlier ones."""

import json
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

logger = logging.getLogger(__name__)

# The GPT of the time-to-plan benchmark: zoo defaults (hidden 64, seq 32, vocab 512,
# micro-batch 8), and a tiny one for smoke tests (--quick).
GPT_WIDTHS = {"hidden_size": 64, "num_heads": 4, "seq_len": 32, "vocab_size": 512, "batch_size": 8}
QUICK_WIDTHS = {
    "hidden_size": 32,
    "num_heads": 2,
    "seq_len": 16,
    "vocab_size": 128,
    "batch_size": 4,
}


def setup_logging(verbose: bool = False) -> None:
    """Log to stderr (stdout carries the table and the JSON line)."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )


def console() -> "Console":
    """A console on stdout, wide enough that tables do not wrap in logs (rich is imported
    here: bench/gpu_check.py uses this module where rich may be missing)."""
    from rich.console import Console

    out = Console(highlight=False)
    if not out.is_terminal:
        out.width = max(out.width, 140)
    return out


def emit_json(figures: dict[str, Any]) -> None:
    """Print the figures as one JSON object (nan and inf as null): the script's last line."""
    sys.stdout.flush()
    print(json_text(figures), flush=True)


def json_text(figures: dict[str, Any]) -> str:
    """The figures as one line of JSON (nan and inf as null)."""
    return json.dumps(_finite(figures), sort_keys=True, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if hasattr(value, "model_dump"):
        return _finite(value.model_dump(mode="json"))
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)


def git_commit() -> str:
    """The working tree's commit (short), or '' outside git."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except OSError:
        return ""
    return out.stdout.strip()


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear between the closest ranks; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: Iterable[float]) -> float:
    data = list(values)
    return float(statistics.median(data)) if data else math.nan


def side_by_side(title: str, rows: Sequence[tuple[Any, ...]], names: tuple[str, ...]) -> "Table":
    """A table of figures: one row per figure (its label, then one value per name), our
    value next to the baselines'."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("figure")
    for name in names:
        table.add_column(name, justify="right")
    for label, *values in rows:
        table.add_row(label, *(fmt(v) for v in values))
    return table


def fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def sqlite_sessions(path: Path) -> Any:
    """A migrated SQLite store at `path` (removed first) and its sessionmaker."""
    from migrations import upgrade
    from store import make_engine, make_sessionmaker

    path.unlink(missing_ok=True)
    url = f"sqlite:///{path}"
    upgrade(url)
    return make_sessionmaker(make_engine(url))


COMPILE_CACHE_ENV = "STAGEPROF_COMPILE_CACHE_DIR"


@contextmanager
def compile_cache(directory: str | Path | None = None) -> Iterator[str]:
    """Within the block, actors started from this process use the persistent compilation
    cache at `directory` (or `off`); None: a new empty temp dir, removed after (a cold run).
    Yields the setting's value."""
    fresh = None if directory is not None else tempfile.mkdtemp(prefix="stageprof-bench-xla-")
    value = str(directory if directory is not None else fresh)
    before = os.environ.get(COMPILE_CACHE_ENV)
    os.environ[COMPILE_CACHE_ENV] = value
    try:
        yield value
    finally:
        if before is None:
            os.environ.pop(COMPILE_CACHE_ENV, None)
        else:
            os.environ[COMPILE_CACHE_ENV] = before
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)


@dataclass
class JobRun:
    """One embedded job run to its end: outcome, wall seconds and its recorded results."""

    job_id: str
    outcome: Any  # workers.jobs.runner.JobOutcome
    wall_seconds: float
    results: dict[tuple[int, int, int, int], Any]  # key -> StageProfileResult
    store_seconds: float
    busy_seconds: float  # actor time inside measure calls (dispatch -> result collected)
    tasks: int
    load_avg: float  # mean 1-minute load average of the machine during the run
    fingerprints: dict[tuple[int, int, int, int], str]  # every candidate's stage fingerprint
    # every candidate's result at every micro-batch size (`results` holds one size's per
    # key: a job that searches counts has a key at each size)
    profiles: list[Any] = field(default_factory=list)


class LoadSampler:
    """Samples the 1-minute load average every `every_s` seconds while in a `with` block."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float:
        return round(statistics.fmean(self.samples), 2) if self.samples else math.nan


@contextmanager
def counting_actor_time() -> Iterator[dict[str, float]]:
    """Within the block, the runner's pools add each task's time on a measuring group (from
    dispatch to its result collected) to `clock["busy"]` and count tasks in `clock["tasks"]`."""
    import workers.jobs.runner as runner_module
    from workers.cluster.pool import GroupPool

    clock = {"busy": 0.0, "tasks": 0.0}

    class CountingPool(GroupPool):
        def _collect(self, group: Any, task: Any, answers: list) -> Any:
            clock["busy"] += time.monotonic() - group.started
            clock["tasks"] += 1
            return super()._collect(group, task, answers)

    original = runner_module.GroupPool
    runner_module.GroupPool = CountingPool  # type: ignore[misc]
    try:
        yield clock
    finally:
        runner_module.GroupPool = original  # type: ignore[misc]


def run_job(
    sessions: Any,
    spec: Any,
    cluster: Any,
    options: Any,
    runner_config: Any,
    *,
    cache_dir: str | Path | None = None,
) -> JobRun:
    """Queue `spec` on `cluster` in the store and run it with a fresh `JobRunner` (local Ray
    must be connected). Wall time is submit → plan stored: the runner's whole job. Its actors
    use the compilation cache at `cache_dir` (or `off`); default: an empty one of its own."""
    from sqlalchemy import select

    from store import create_job, job_results, put_model, session_scope
    from store.queries import job_micro_batch_sizes
    from store.tables import JobCandidateRow as C
    from workers.jobs.runner import JobRunner

    with session_scope(sessions) as s:
        model, _ = put_model(s, spec=spec)
        job_id = create_job(s, model_id=model.id, cluster=cluster, options=options).id
    runner = JobRunner(sessions, runner_config)
    with compile_cache(cache_dir), counting_actor_time() as clock, LoadSampler() as load:
        began = time.perf_counter()
        outcome = runner.run_next(job_id)
        wall = time.perf_counter() - began
    assert outcome is not None, "the job just queued could not be claimed"
    with session_scope(sessions) as s:
        results = dict(job_results(s, job_id=job_id))
        rows = s.execute(
            select(C.start, C.end, C.submesh_id, C.config_id, C.fingerprint).where(
                C.job_id == job_id
            )
        )
        fingerprints = {(a, b, m, c): fp for a, b, m, c, fp in rows}
        profiles = [
            result
            for size in job_micro_batch_sizes(s, job_id=job_id)
            for result in job_results(s, job_id=job_id, micro_batch_size=size).values()
        ]
    return JobRun(
        job_id,
        outcome,
        wall,
        results,
        outcome.stats.store_seconds,
        busy_seconds=clock["busy"],
        tasks=int(clock["tasks"]),
        load_avg=load.mean,
        fingerprints=fingerprints,
        profiles=profiles,
    )


def plan_keys(plan: Any) -> list[tuple[int, int, int, int]]:
    """A plan's stages as (start, end, submesh_id, config_id)."""
    return [(s.start, s.end, s.submesh_id, s.config_id) for s in plan.stages]


def plan_cost(keys: Sequence[tuple[int, int, int, int]], results: dict, microbatches: int) -> float:
    """Alpa's objective Σt + (B-1)·max t of the stages `keys`, with t = forward + backward
    from `results` (inf when a stage has no ok result there)."""
    times = []
    for key in keys:
        result = results.get(key)
        if result is None or not result.ok:
            return math.inf
        times.append(result.compute_cost)
    return sum(times) + (microbatches - 1) * max(times)
