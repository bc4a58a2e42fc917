"""The compose topology as local processes: each `stageprof` command in its own process group,
its output in a log file, all of them stopped (group and children) when the stack closes."""

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

from tests.support.processes import stop_processes
from tests.support.waiting import wait_until

STOP_GRACE_S = 30.0
START_TIMEOUT_S = 90.0
_SCRIPT = Path(sys.executable).with_name("stageprof")
# The installed console script (what the compose file runs); the module when it is missing.
STAGEPROF = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "cli"]


@dataclass
class Service:
    """One long-running command of the stack."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class LocalStack:
    """`with LocalStack(tmp_path, env) as stack:` runs commands; on exit every one is stopped."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = env
        self.services: list[Service] = []
        self._one_shot_logs: list[tuple[str, str]] = []

    def run(self, name: str, *args: str, timeout_s: float = 120.0) -> str:
        """Run a one-shot `stageprof` command (like compose's migrate); its output."""
        done = subprocess.run(
            [*STAGEPROF, *args],
            env=self.env,
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        output = done.stdout + done.stderr
        self._one_shot_logs.append((name, output))
        assert done.returncode == 0, f"{name} exited {done.returncode}:\n{output}"
        return output

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> Service:
        """Start a long-running `stageprof` command in a new process group."""
        log_path = self.workdir / f"{name}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [*STAGEPROF, *args],
                env=env or self.env,
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        service = Service(name=name, proc=proc, log_path=log_path)
        self.services.append(service)
        return service

    def assert_running(self) -> None:
        """Fail, naming the service, when a long-running command has exited."""
        for s in self.services:
            code = s.proc.poll()
            assert code is None, f"{s.name} exited with {code}:\n{s.log()}"

    def wait_healthy(self, base_url: str, timeout_s: float = START_TIMEOUT_S) -> dict:
        """Poll `/healthz` until it answers 200 (the API is up and reaches its database)."""

        def health() -> dict | None:
            try:
                r = httpx.get(f"{base_url}/healthz", timeout=2.0)
            except httpx.TransportError:
                return None
            return r.json() if r.status_code == 200 else None

        return wait_until(
            health, timeout_s, f"{base_url} healthy", interval_s=0.25, check=self.assert_running
        )

    def logs(self) -> str:
        parts = [f"===== {name} =====\n{out}" for name, out in self._one_shot_logs]
        parts += [f"===== {s.name} (pid {s.proc.pid}) =====\n{s.log()}" for s in self.services]
        return "\n".join(parts)

    def stop(self) -> None:
        """SIGTERM every process group, wait for the leaders, then SIGKILL what is left."""
        stop_processes([s.proc for s in self.services], grace_s=STOP_GRACE_S, group=True)

    def __enter__(self) -> "LocalStack":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        finally:
            if exc_type is not None:
                # pytest shows captured output of a failed test: the services' logs.
                print(self.logs())
