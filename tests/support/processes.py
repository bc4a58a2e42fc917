"""Stopping the processes a test started, a free port for one to listen on, and the
environment to start one in."""

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence

# Kept when a child drops this shell's STAGEPROF_* settings: the test session's own
# compilation cache (tests/conftest.py), so no child reads or fills the user's.
SESSION_SETTINGS = ("STAGEPROF_COMPILE_CACHE_DIR",)


def settings_free_env(
    also: Iterable[str] = (), environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """`environ` without its STAGEPROF_* settings (but `SESSION_SETTINGS`) and the `also`
    variables."""
    dropped = set(also)
    return {
        k: v
        for k, v in environ.items()
        if k not in dropped and (not k.startswith("STAGEPROF_") or k in SESSION_SETTINGS)
    }


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_processes(
    procs: Sequence[subprocess.Popen],
    *,
    sig: signal.Signals = signal.SIGTERM,
    grace_s: float = 30.0,
    group: bool = False,
) -> None:
    """Send `sig` to each process (to its process group when `group`: started with
    `start_new_session=True`), wait up to `grace_s` seconds for them all, then SIGKILL what
    is left and reap it."""
    for proc in procs:
        _signal(proc, sig, group)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        if group or proc.poll() is None:
            _signal(proc, signal.SIGKILL, group)  # a group's children may outlive its leader
        proc.wait()


def _signal(proc: subprocess.Popen, sig: signal.Signals, group: bool) -> None:
    try:
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass
