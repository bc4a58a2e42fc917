"""`stageprof serve` starts uvicorn with the app factory on a migrated database."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cli.main import build_parser
from tests.support.processes import free_port, stop_processes
from tests.support.waiting import wait_until

START_TIMEOUT_S = 60


def test_serve_arguments() -> None:
    args = build_parser().parse_args(["serve", "--port", "9001", "--workers", "3"])
    assert (args.host, args.port, args.workers, args.no_migrate) == ("127.0.0.1", 9001, 3, False)


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_runs_the_api(tmp_path: Path, workers: int) -> None:
    port = free_port()
    url = f"sqlite:///{tmp_path / 'served.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGEPROF_")}
    cmd = [sys.executable, "-m", "cli", "serve", "--port", str(port)]
    cmd += ["--workers", str(workers), "--database-url", url, "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:

        def running() -> None:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""

        def health() -> httpx.Response | None:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
            except httpx.TransportError:
                return None

        r = wait_until(health, START_TIMEOUT_S, "stageprof serve answering", check=running)
        assert r.json() == {"status": "ok", "database": "ok"}
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/plans", json={"zoo": "mlp", "config": {"preset": "tiny"}}
        )
        assert r.status_code == 202
        jobs = httpx.get(f"http://127.0.0.1:{port}/v1/jobs").json()["items"]
        assert [j["id"] for j in jobs] == [r.json()["job_id"]]
    finally:
        stop_processes([proc], sig=signal.SIGINT)
