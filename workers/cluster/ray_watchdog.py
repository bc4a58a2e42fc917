"""`python -m workers.cluster.ray_watchdog PID SESSION`: outlive process PID (a worker that
started a local Ray) and, once it is gone however it died (kill -9 included), stop every process of
its Ray session, so that no Ray process survives the worker by more than a second or two.

The session's processes are those whose command line names the session, and every
descendant of PID seen while it lived: Ray's agents rename themselves (`ray::DashboardAgent`)
and ignore SIGTERM, so they are found by ancestry and killed with SIGKILL after a grace.

Started by `workers.cluster.ray_env.connect_ray` in a session of its own, so that a signal to the
worker's process group does not reach it."""

import os
import signal
import sys
import time
from pathlib import Path

POLL_S = 0.5
TERM_GRACE_S = 1.0


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat); None when it is gone or a
    zombie. Compared to tell the watched process from a later one given the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def session_pids(session: str) -> list[int]:
    """Processes whose command line names the Ray session `session` (not this one)."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if session.encode() in cmdline:
            found.append(int(entry.name))
    return found


def descendants(pid: int) -> set[tuple[int, str]]:
    """(pid, start time) of every live descendant of `pid`."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append((int(entry.name), fields[19]))
    found: set[tuple[int, str]] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child[0])
    return found


def stop_session(session: str, known: set[tuple[int, str]] | None = None) -> int:
    """SIGTERM the session's processes (and `known` ones still alive, same start time),
    SIGKILL those still there after a grace; how many there were."""

    def alive() -> list[int]:
        mine = {p for p, started in known or () if _start_time(p) == started}
        return sorted(mine | set(session_pids(session)))

    pids = alive()
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE_S
    while time.monotonic() < deadline and alive():
        time.sleep(0.1)
    for pid in alive():
        _signal(pid, signal.SIGKILL)
    return len(pids)


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str]) -> int:
    parent, session = int(argv[0]), argv[1]
    started = _start_time(parent)
    known: set[tuple[int, str]] = set()
    while started is not None and _start_time(parent) == started:
        known |= descendants(parent)
        time.sleep(POLL_S)
    known.discard((os.getpid(), _start_time(os.getpid()) or ""))
    stop_session(session, known)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
