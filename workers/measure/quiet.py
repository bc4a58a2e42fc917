"""Quiet timing: a machine-wide readers/writer lock, so that no process's compile runs
while another process times a module.

Compiles are readers (`compile_slot`, `LOCK_SH`: any number at once); a timing section is
the writer (`timing_slot`, `LOCK_EX`: it waits until no other process compiles or times,
and compiles that arrive later wait behind it). A second file, the turnstile, gives the
writer that preference: `flock` alone lets a stream of overlapping compiles starve it.

Locks are `fcntl.flock` on files in `$STAGEPROF_LOCK_DIR` (default: the temp dir), one per
section, so the kernel drops them when the file is closed, which includes a killed holder.
`STAGEPROF_QUIET_TIMING=0` turns both sections into no-ops.
"""

import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from schemas.settings import env_name, env_settings

ENV_ENABLED = env_name("quiet_timing")
ENV_DIR = env_name("lock_dir")
LOCK_NAME = "stageprof-quiet.lock"
TURNSTILE_NAME = "stageprof-quiet.turnstile"
POLL_MAX_S = 0.005  # longest sleep between tries when a wait is bounded

_held = threading.local()  # .mode: None, "compile" or "timing" (this thread's section)


@dataclass(frozen=True)
class Slot:
    """What a section got: `quiet` is False when the discipline is off or the wait for the
    lock passed `max_wait_s` (the section then ran without it); `waited_s` is the wait."""

    kind: str
    quiet: bool
    waited_s: float


def enabled() -> bool:
    """Whether the discipline is on (`STAGEPROF_QUIET_TIMING` unset or not 0/false/off/no)."""
    return env_settings().quiet_timing


def lock_dir() -> Path:
    """Where the lock files live: `$STAGEPROF_LOCK_DIR`, else the temp dir."""
    return Path(env_settings().lock_dir or tempfile.gettempdir())


@contextmanager
def compile_slot(max_wait_s: float | None = None) -> Iterator[Slot]:
    """A section that disturbs timing (compiling): runs alongside other compiles, never
    while another process times. Inside this thread's own section it is a no-op."""
    with _section("compile", fcntl.LOCK_SH, max_wait_s) as slot:
        yield slot


@contextmanager
def timing_slot(max_wait_s: float | None = None) -> Iterator[Slot]:
    """A section that is disturbed (timing): waits until no other process compiles or
    times. Raises RuntimeError inside this thread's `compile_slot` (it would wait for
    itself); inside its own `timing_slot` it is a no-op."""
    with _section("timing", fcntl.LOCK_EX, max_wait_s) as slot:
        yield slot


@contextmanager
def _section(kind: str, op: int, max_wait_s: float | None) -> Iterator[Slot]:
    mode = getattr(_held, "mode", None)
    if not enabled():
        yield Slot(kind, quiet=False, waited_s=0.0)
        return
    if mode == "compile" and kind == "timing":
        raise RuntimeError("timing_slot inside this thread's compile_slot would wait for itself")
    if mode is not None:  # nested: the outer section already holds what this one needs
        yield Slot(kind, quiet=True, waited_s=0.0)
        return
    began = time.monotonic()
    until = None if max_wait_s is None else began + max_wait_s
    main = _open(lock_dir() / LOCK_NAME)
    try:
        turnstile = _open(lock_dir() / TURNSTILE_NAME)
        try:
            got = _acquire(turnstile, fcntl.LOCK_EX, until) and _acquire(main, op, until)
        finally:
            os.close(turnstile)  # writers queue on the turnstile only while they wait
        _held.mode = kind
        try:
            yield Slot(kind, quiet=got, waited_s=time.monotonic() - began)
        finally:
            _held.mode = None
    finally:
        os.close(main)  # releases the flock


def _open(path: Path) -> int:
    """A descriptor to lock `path` with (read-only: flock needs no write access); open an
    existing file without O_CREAT, which a sticky shared temp dir may refuse."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)


def _acquire(fd: int, op: int, until: float | None) -> bool:
    """`flock(fd, op)`: blocking when `until` is None, else polled; False past `until`."""
    if until is None:
        fcntl.flock(fd, op)
        return True
    delay = 0.0005
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            left = until - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(delay, left))
            delay = min(2 * delay, POLL_MAX_S)
