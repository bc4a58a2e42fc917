"""`stageprof plan --server` through a pipe: a job no worker takes says it is queued."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.server.live import LiveServer
from tests.support.processes import stop_processes


def test_plan_server_shows_queued_while_no_worker_takes_the_job(
    live_server: LiveServer, api: httpx.Client
) -> None:
    cmd = [sys.executable, "-m", "cli", "plan", "--server", live_server.url]
    cmd += ["--zoo", "mlp", "--set", "preset=tiny", "--devices-per-host", "2"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGEPROF_")}
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=Path(__file__).parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    started = time.monotonic()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.startswith("queued:") or time.monotonic() - started > 60:
                break
    finally:
        stop_processes([proc], sig=signal.SIGKILL)
    queued = [ln for ln in lines if ln.startswith("queued:")]
    assert queued, lines
    assert "waiting for a worker" in queued[0]
    (job,) = api.get("/v1/jobs").json()["items"]
    assert job["status"] == "queued"
    assert api.delete(f"/v1/jobs/{job['id']}").status_code == 200


def test_plan_server_with_an_idempotency_key_follows_the_first_job(
    live_server: LiveServer, api: httpx.Client
) -> None:
    def submit() -> str:
        cmd = [sys.executable, "-m", "cli", "plan", "--server", live_server.url, "--zoo", "mlp"]
        cmd += ["--set", "preset=tiny", "--devices-per-host", "2", "--idempotency-key", "ci-42"]
        proc = subprocess.Popen(
            cmd, cwd=Path(__file__).parents[2], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()
        stop_processes([proc], sig=signal.SIGKILL)
        return first

    assert "queued at" in submit()
    again = submit()
    assert "following job" in again, again
    (job,) = api.get("/v1/jobs").json()["items"]  # one job for both attempts
    assert again.split("following job ")[1].startswith(job["id"])
    api.delete(f"/v1/jobs/{job['id']}")
