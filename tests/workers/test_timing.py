"""Adaptive timed runs, their relative spread, and the machine-wide quiet-timing lock."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from workers.measure.quiet import ENV_DIR, ENV_ENABLED, compile_slot, timing_slot
from workers.measure.timing import (
    ENV_CLOCK,
    CandidateTimeout,
    Deadline,
    clock_for,
    relative_spread,
    time_runs,
)

ROOT = Path(__file__).resolve().parents[2]


class FakeRun:
    """A run that takes the next of `durations` (seconds) on a fake clock."""

    def __init__(self, durations: list[float]) -> None:
        self.durations = iter(durations)
        self.now = 0.0
        self.calls = 0

    def clock(self) -> float:
        return self.now

    def __call__(self) -> int:
        self.calls += 1
        self.now += next(self.durations)
        return self.calls


def test_relative_spread_of_known_samples() -> None:
    # p10 = 1.4, p90 = 4.6 (linear), median 3
    assert relative_spread([5.0, 1.0, 3.0, 2.0, 4.0]) == pytest.approx(3.2 / 3)
    assert relative_spread([2.0, 2.0, 2.0]) == 0.0
    assert relative_spread([10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 50.0]) == 0
    assert relative_spread([1.0, 3.0]) == pytest.approx(1.6 / 2)
    assert relative_spread([]) == 0.0 and relative_spread([7.0]) == 0.0
    assert relative_spread([0.0, 0.0, 1.0]) == 0.0  # zero median


def test_adaptive_runs_stop_early_when_steady() -> None:
    run = FakeRun([1.0] * 2 + [0.010] * 100)
    samples, out = time_runs(
        run, 2, 5, Deadline(60), "forward", max_repeats=40, target_spread=0.05, clock=run.clock
    )
    assert samples == pytest.approx([0.010] * 5)  # warm-up not timed, no run past `repeats`
    assert out == 7 and run.calls == 7


def test_adaptive_runs_go_on_until_the_spread_is_under_target() -> None:
    # one slow run among steady ones: p90 leaves it out from the 11th sample on
    run = FakeRun([0.010] * 4 + [0.050] + [0.010] * 100)
    samples, _ = time_runs(
        run, 0, 5, Deadline(60), "forward", max_repeats=40, target_spread=0.05, clock=run.clock
    )
    assert len(samples) == 11
    assert relative_spread(samples) <= 0.05 < relative_spread(samples[:10])


def test_adaptive_runs_stop_at_the_cap_when_noisy() -> None:
    run = FakeRun([0.010, 0.020] * 100)
    samples, _ = time_runs(
        run, 1, 5, Deadline(60), "backward", max_repeats=12, target_spread=0.05, clock=run.clock
    )
    assert len(samples) == 12 and run.calls == 13
    assert relative_spread(samples) > 0.05


def test_without_a_target_the_runs_are_exactly_repeats() -> None:
    run = FakeRun([0.010, 0.020] * 100)
    samples, _ = time_runs(run, 0, 5, Deadline(60), "forward", max_repeats=40, clock=run.clock)
    assert len(samples) == 5
    run = FakeRun([0.010] * 100)  # a cap below `repeats` never cuts the least number of runs
    samples, _ = time_runs(
        run, 0, 5, Deadline(60), "forward", max_repeats=3, target_spread=0.05, clock=run.clock
    )
    assert len(samples) == 5


def test_adaptive_runs_check_the_deadline_between_runs() -> None:
    run = FakeRun([0.010, 0.020] * 100)
    deadline = Deadline(0.1, clock=run.clock)
    with pytest.raises(CandidateTimeout, match="phase 'forward'"):
        time_runs(
            run, 0, 5, deadline, "forward", max_repeats=40, target_spread=0.05, clock=run.clock
        )
    assert 5 < run.calls < 40  # stopped by the deadline, past `repeats`, before the cap


# --- the quiet-timing lock -------------------------------------------------------------

CHILD = """
import sys, time
from workers.measure.quiet import compile_slot, timing_slot
kind, hold = sys.argv[1], float(sys.argv[2])
print("ready", flush=True)
start_at = float(sys.stdin.readline())
while time.monotonic() < start_at:
    time.sleep(0.001)
requested = time.monotonic()
with (timing_slot if kind == "timing" else compile_slot)() as slot:
    began = time.monotonic()
    print("held", flush=True)
    time.sleep(hold)
    ended = time.monotonic()
print(requested, began, ended, slot.quiet, flush=True)
"""


@pytest.fixture
def lock_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The lock on, in a directory of this test's own."""
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    monkeypatch.setenv(ENV_ENABLED, "1")
    yield {**os.environ, ENV_DIR: str(tmp_path), ENV_ENABLED: "1", "PYTHONPATH": str(ROOT)}


def spawn(env: dict[str, str], kind: str, hold: float) -> subprocess.Popen:
    """A process that takes a `kind` section for `hold` s once told when (see `start`)."""
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, kind, str(hold)],
        env=env,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def start(proc: subprocess.Popen, at: float) -> None:
    """Wait until `proc` is ready, then tell it to ask for its section at `at`."""
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.stdin.write(f"{at}\n")
    proc.stdin.flush()


def run_sections(env: dict[str, str], plan: list[tuple[str, float, float]]) -> list[tuple]:
    """Start one process per (kind, start offset s, hold s), all ready before the first
    starts; returns (requested, began, ended, quiet) of each, on the system monotonic clock."""
    procs = [spawn(env, kind, hold) for kind, _, hold in plan]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    t0 = time.monotonic() + 0.1
    for proc, (_, offset, _) in zip(procs, plan, strict=True):
        assert proc.stdin is not None
        proc.stdin.write(f"{t0 + offset}\n")
        proc.stdin.flush()
    out = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        req, began, ended, quiet = stdout.split()[-4:]
        out.append((float(req), float(began), float(ended), quiet == "True"))
    return out


def overlap(a: tuple, b: tuple) -> bool:
    return max(a[1], b[1]) < min(a[2], b[2])


def test_timing_sections_of_two_processes_never_overlap(lock_env: dict[str, str]) -> None:
    a, b = run_sections(lock_env, [("timing", 0.0, 0.3), ("timing", 0.0, 0.3)])
    assert a[3] and b[3]
    assert not overlap(a, b)


def test_compile_sections_run_together(lock_env: dict[str, str]) -> None:
    a, b = run_sections(lock_env, [("compile", 0.0, 0.6), ("compile", 0.0, 0.6)])
    assert overlap(a, b)


def test_timing_waits_for_compiles_and_later_compiles_wait_for_it(
    lock_env: dict[str, str],
) -> None:
    plan = [("compile", 0.0, 1.0), ("timing", 0.25, 0.3), ("compile", 0.5, 0.3)]
    first, timing, late = run_sections(lock_env, plan)
    # the intended order of requests held: timing asked while the first compile ran, and the
    # late compile asked after timing, while the first compile still ran
    assert first[1] < timing[0] < late[0] < first[2]
    assert timing[1] >= first[2]  # waited for the compile to end
    assert late[1] >= timing[2]  # queued behind the waiting timer, not beside the compile
    assert not overlap(timing, first) and not overlap(timing, late)


def test_a_killed_holder_leaves_the_lock_free(lock_env: dict[str, str]) -> None:
    proc = spawn(lock_env, "timing", 60.0)
    start(proc, time.monotonic())
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    with timing_slot(max_wait_s=0.2) as slot:  # held by the child: gives up waiting
        assert not slot.quiet and slot.waited_s >= 0.2
    with compile_slot(max_wait_s=0.1) as slot:
        assert not slot.quiet
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    with timing_slot(max_wait_s=5.0) as slot:
        assert slot.quiet and slot.waited_s < 1.0


def test_nesting_and_switching_off(
    lock_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with timing_slot() as outer:
        assert outer.quiet
        with compile_slot() as inner, timing_slot() as again:  # no-ops, no self-deadlock
            assert inner.quiet and again.quiet
    with compile_slot(), pytest.raises(RuntimeError, match="wait for itself"):
        with timing_slot():
            pass
    monkeypatch.setenv(ENV_ENABLED, "0")
    with compile_slot() as c, timing_slot() as t:
        assert not c.quiet and not t.quiet


def test_a_starting_actor_waits_for_another_process_s_timing(
    lock_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An actor's start (importing jax and the measuring code, making its devices) is a
    compile section: it never runs while another process times."""
    import workers.measure.compile_cache as cache
    from workers.cluster.host_group import HostWorker

    monkeypatch.setattr(cache, "enable_compile_cache", lambda: None)  # this process's jax
    proc = spawn(lock_env, "timing", 0.6)
    start(proc, time.monotonic())
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    worker = object.__new__(HostWorker)  # the actor's body, outside Ray
    worker.rank, worker.size, worker.use_gpus, worker.ident = 0, 1, False, "test"
    info = worker.join(None)
    joined = time.monotonic()
    stdout, _ = proc.communicate(timeout=30)
    ended = float(stdout.split()[-2])
    assert joined >= ended and info["num_devices"] >= 1


def test_clock_is_wall_unless_cpu_time_is_asked_for_on_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import jax

    monkeypatch.delenv(ENV_CLOCK, raising=False)
    gpu = SimpleNamespace(platform="gpu")
    assert clock_for(jax.devices()) is time.perf_counter
    assert clock_for([gpu]) is time.perf_counter and clock_for([]) is time.perf_counter
    monkeypatch.setenv(ENV_CLOCK, "cpu")
    assert clock_for(jax.devices()) is time.process_time
    assert clock_for([gpu]) is time.perf_counter  # a GPU's work is not CPU time


def test_budget_stops_adding_runs() -> None:
    now = [0.0]

    def run() -> None:
        now[0] += 0.5 if len(calls) % 2 else 0.1  # a spread that never settles
        calls.append(1)

    calls: list[int] = []
    samples, _ = time_runs(
        run,
        0,
        3,
        Deadline(60),
        "forward",
        max_repeats=40,
        target_spread=0.05,
        budget_s=2.0,
        clock=lambda: now[0],
    )
    assert 3 <= len(samples) < 40 and sum(samples[:-1]) < 2.0 <= sum(samples)


def test_process_time_leaves_out_a_sleeping_run() -> None:
    """The CPU clock counts work, not waiting: a sleep costs (almost) nothing on it."""
    samples, _ = time_runs(
        lambda: time.sleep(0.02), 0, 3, Deadline(60), "forward", clock=time.process_time
    )
    assert max(samples) < 0.01
